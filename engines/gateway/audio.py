"""/v1/audio/transcriptions and /v1/audio/translations: multipart uploads relayed to a
speech-to-text engine.

The upload is read as it arrives and refused with 413 as soon as it passes
``gateway.max_audio_bytes`` (or at once when its Content-Length says so), so a 2 GB upload never
sits in memory. The form is parsed as it arrives too, by python-multipart's push parser (the
one Starlette uses), a slice at a time with the event loop given back after each, and it is
refused with 400 as soon as it has more than ``MAX_FORM_PARTS`` parts or no first part in its
first ``FIRST_PART_WITHIN_BYTES`` (a body of hundreds of thousands of tiny parts, or of a
preamble of millions of empty lines, would otherwise keep the gateway busy for a minute). The
form must carry the audio as a ``file`` part and a ``model`` field; the body is relayed as
received (same boundary).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from aiohttp import web
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from engines.core.http import openai_error
from engines.gateway.forward import Outbound, dispatch
from engines.gateway.service import GatewayContext
from engines.gateway.shapes import body_too_slow

log = logging.getLogger(__name__)
# it logs each malformed body as a warning of its own; the refusal below says it once
logging.getLogger("python_multipart.multipart").setLevel(logging.ERROR)

READ_CHUNK_BYTES = 64 * 1024
FEED_BYTES = 16 * 1024
"""The parser is given the body this much at a time, and the loop is given back after each
slice: the most it works on in one go (a few milliseconds)."""
PREAMBLE_FEED_BYTES = 2 * 1024
"""The slice before the first part: a preamble is read line by line, up to a line per two
bytes."""
MAX_FORM_PARTS = 100
"""Most parts (files and fields together) an audio form may have; OpenAI's and vLLM's
transcription forms use a few dozen at most."""
FIRST_PART_WITHIN_BYTES = 64 * 1024
"""The first part must begin within this many bytes (clients send no preamble)."""
MAX_MODEL_BYTES = 1024
"""The longest ``model`` field kept; a model's name is far shorter."""
MAX_PART_HEADERS = 16
MAX_PART_HEADER_BYTES = 8 * 1024
_HOW = "(for example: curl -F file=@speech.wav -F model=NAME URL)"


async def audio(ctx: GatewayContext, request: web.Request) -> web.StreamResponse:
    limit = ctx.settings.gateway.max_audio_bytes
    ctype = request.headers.get("Content-Type", "")
    if not ctype.lower().startswith("multipart/form-data"):
        return openai_error(
            400, f"send the audio as multipart/form-data with a 'file' part and a 'model' {_HOW}"
        )
    declared = request.content_length
    if declared is not None and declared > limit:
        return _too_big(limit, declared)
    form = _Form()
    try:
        body = await _read_form(request, ctype, form, limit, ctx.settings.gateway.body_timeout_s)
    except TimeoutError:
        return body_too_slow(request.path, ctx.settings.gateway.body_timeout_s)
    if body is None:
        return _too_big(limit, None)
    if form.problem:
        if form.parts > MAX_FORM_PARTS:
            log.warning("refused an audio upload from %s: %s", request.remote, form.problem)
        resp = openai_error(400, form.problem, param=form.param, code="invalid_form")
        resp.force_close()  # the rest of the upload may be unread
        return resp
    return await dispatch(ctx, request, Outbound(body, form.model, content_type=ctype))


@dataclass
class _Form:
    """What the parser has found in the form so far."""

    parts: int = 0
    model: str = ""
    has_file: bool = False
    problem: str = ""
    """Set when the form is refused: what is wrong with it, said to the client."""
    param: str | None = None
    ended: bool = False  # the closing boundary came


@dataclass
class _Part:
    """The part being read: its headers as they come, and what is kept of its data."""

    header_name: bytearray = field(default_factory=bytearray)
    header_value: bytearray = field(default_factory=bytearray)
    name: str = ""
    size: int = 0
    kept: bytearray = field(default_factory=bytearray)


class _FormReader:
    """python-multipart's callbacks, filling a ``_Form``; past the first problem they only
    note nothing more (the reading stops at the end of the slice)."""

    def __init__(self, boundary: bytes, form: _Form) -> None:
        self.form = form
        self._part = _Part()
        self.parser = MultipartParser(
            boundary,
            {
                "on_part_begin": self._begin,
                "on_header_field": self._header_name,
                "on_header_value": self._header_value,
                "on_header_end": self._header_end,
                "on_part_data": self._data,
                "on_part_end": self._end,
                "on_end": self._finished,
            },
            max_header_count=MAX_PART_HEADERS,
            max_header_size=MAX_PART_HEADER_BYTES,
        )

    def _begin(self) -> None:
        self.form.parts += 1
        self._part = _Part()
        if self.form.parts > MAX_FORM_PARTS and not self.form.problem:
            self.form.problem = (
                f"the form has more than {MAX_FORM_PARTS} parts (files and fields); an audio "
                f"upload needs a 'file' part, a 'model' field and a few options {_HOW}"
            )

    def _header_name(self, data: bytes, start: int, end: int) -> None:
        self._part.header_name += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._part.header_value += data[start:end]

    def _header_end(self) -> None:
        part = self._part
        name = bytes(part.header_name).strip().lower()
        value = bytes(part.header_value).decode("latin-1")
        part.header_name.clear()
        part.header_value.clear()
        if name == b"content-disposition":
            part.name = parse_options_header(value)[1].get(b"name", b"").decode("utf-8", "replace")
        elif name == b"content-type" and value.strip().lower().startswith("multipart/"):
            self.form.problem = self.form.problem or (
                f"a form part may not be a multipart body of its own {_HOW}"
            )

    def _data(self, data: bytes, start: int, end: int) -> None:
        part = self._part
        part.size += end - start
        if part.name == "model" and len(part.kept) < MAX_MODEL_BYTES:
            part.kept += data[start : min(end, start + MAX_MODEL_BYTES - len(part.kept))]

    def _end(self) -> None:
        part = self._part
        if part.name == "file" and part.size:
            self.form.has_file = True
        elif part.name == "model":
            self.form.model = part.kept.decode("utf-8", "replace").strip()

    def _finished(self) -> None:
        self.form.ended = True


async def _read_form(
    request: web.Request, ctype: str, form: _Form, limit: int, idle_s: float
) -> bytes | None:
    """The body, parsed into ``form`` while it arrives; None as soon as it passes ``limit``
    bytes. Reading stops early once ``form.problem`` is set. TimeoutError when no byte of it
    came for ``idle_s`` (an upload may be long, not stuck)."""
    boundary = parse_options_header(ctype)[1].get(b"boundary", b"")
    if not boundary or len(boundary) > 70:
        form.problem = (
            f"the multipart body could not be read (no boundary in its Content-Type) {_HOW}"
        )
        return b""
    reader = _FormReader(boundary, form)
    buf = bytearray()
    chunks = request.content.iter_chunked(READ_CHUNK_BYTES)
    while True:
        async with asyncio.timeout(idle_s):
            chunk = await anext(chunks, b"")
        if not chunk:
            break
        fed = len(buf)
        buf += chunk
        if len(buf) > limit:
            return None
        await _feed(reader, chunk, fed)
        if form.problem:
            return bytes(buf)
    _check_whole(form)
    return bytes(buf)


async def _feed(reader: _FormReader, chunk: bytes, fed: int) -> None:
    """Give the parser ``chunk`` (the body's bytes after the first ``fed``) a slice at a time,
    giving the loop back after each."""
    form = reader.form
    start = 0
    while start < len(chunk) and not form.problem:
        end = start + (FEED_BYTES if form.parts else PREAMBLE_FEED_BYTES)
        try:
            reader.parser.write(chunk[start:end])
        except MultipartParseError as exc:
            form.problem = f"the multipart body could not be read ({exc}) {_HOW}"
            return
        await asyncio.sleep(0)
        start = end
        if not form.parts and fed + start > FIRST_PART_WITHIN_BYTES:
            form.problem = (
                f"no form part begins in the first {FIRST_PART_WITHIN_BYTES} bytes "
                f"(a multipart body starts with its boundary) {_HOW}"
            )


def _check_whole(form: _Form) -> None:
    """The whole body came: it must have ended with its closing boundary, and hold the audio
    and the model's name."""
    if not form.ended:
        form.problem = (
            f"the multipart body could not be read (it ends before its closing boundary) {_HOW}"
        )
    elif not form.has_file:
        form.param = "file"
        form.problem = f"the form has no 'file' part with audio in it {_HOW}"
    elif not form.model:
        form.param = "model"
        form.problem = (
            f"the form has no 'model' field: one of the names GET /v1/models lists {_HOW}"
        )


def _too_big(limit: int, declared: int | None) -> web.Response:
    size = f" ({declared} bytes)" if declared is not None else ""
    resp = openai_error(
        413,
        f"audio upload larger than {limit} bytes{size}; split the recording, or raise "
        "gateway.max_audio_bytes (the engine has its own limit too: vLLM's "
        "VLLM_MAX_AUDIO_CLIP_FILESIZE_MB)",
    )
    resp.force_close()  # the unread rest of the upload must not be taken for the next request
    return resp
