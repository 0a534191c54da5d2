"""/v1/audio/transcriptions and /v1/audio/translations: multipart uploads relayed to a
speech-to-text engine.

The upload is read as it arrives and refused with 413 as soon as it passes
``gateway.max_audio_bytes`` (or at once when its Content-Length says so), so a 2 GB upload never
sits in memory. The form must carry the audio as a ``file`` part and a ``model`` field; the body
is relayed as received (same boundary).
"""

from __future__ import annotations

import asyncio
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser

from aiohttp import web

from engines.gateway.forward import Outbound, dispatch
from engines.gateway.service import GatewayContext
from engines.gateway.shapes import body_too_slow
from engines.http import openai_error

READ_CHUNK_BYTES = 64 * 1024
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
    try:
        body = await _read_at_most(request, limit, ctx.settings.gateway.body_timeout_s)
    except TimeoutError:
        return body_too_slow(request.path, ctx.settings.gateway.body_timeout_s)
    if body is None:
        return _too_big(limit, None)
    model, problem = _form_fields(ctype, body)
    if problem:
        return openai_error(400, problem, param="file" if "file" in problem else "model")
    return await dispatch(ctx, request, Outbound(body, model, content_type=ctype))


async def _read_at_most(request: web.Request, limit: int, idle_s: float) -> bytes | None:
    """The body, or None as soon as it passes ``limit`` bytes (the rest is never read).
    TimeoutError when no byte of it came for ``idle_s`` (an upload may be long, not stuck)."""
    buf = bytearray()
    chunks = request.content.iter_chunked(READ_CHUNK_BYTES)
    while True:
        async with asyncio.timeout(idle_s):
            chunk = await anext(chunks, b"")
        if not chunk:
            return bytes(buf)
        buf += chunk
        if len(buf) > limit:
            return None


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


def _form_fields(ctype: str, body: bytes) -> tuple[str, str]:
    """(model, "") or ("", what is wrong with the form)."""
    head = b"Content-Type: " + ctype.encode("latin-1", "replace") + b"\r\n\r\n"
    message = BytesParser(EmailMessage, policy=policy.HTTP).parsebytes(head + body)
    if not message.is_multipart():
        return "", f"the multipart body could not be read (check its boundary) {_HOW}"
    model, has_file = "", False
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if name == "file" and part.get_payload(decode=True):
            has_file = True
        elif name == "model":
            value = part.get_payload(decode=True)
            model = value.decode("utf-8", "replace").strip() if isinstance(value, bytes) else ""
    if not has_file:
        return "", f"the form has no 'file' part with audio in it {_HOW}"
    if not model:
        return "", f"the form has no 'model' field: one of the names GET /v1/models lists {_HOW}"
    return model, ""
