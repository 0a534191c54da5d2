"""OpenAI's Files API on the gateway's port, under the same API keys as every /v1 route:

POST   /v1/files               multipart upload: ``file`` and ``purpose=batch``
GET    /v1/files               the caller's files (``?purpose``)
GET    /v1/files/{id}          one file's FileObject
GET    /v1/files/{id}/content  its bytes
DELETE /v1/files/{id}          forget it
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from pathlib import Path

from aiohttp import BodyPartReader, web

from engines.batch.files import PURPOSES, FileStore, StoredFile
from engines.gateway.responses import caller_of
from engines.gateway.service import GATEWAY
from engines.gateway.shapes import api_error

FILES: web.AppKey[FileStore] = web.AppKey("files", FileStore)
"""``request.app[FILES]``: the uploaded files (mounted by the daemon)."""

FILE_ROUTES = (
    "POST /v1/files",
    "GET /v1/files",
    "GET /v1/files/{id}",
    "GET /v1/files/{id}/content",
    "DELETE /v1/files/{id}",
)
_FILE_ID = re.compile(r"^file-[0-9a-f]{24}$")
_CHUNK_BYTES = 256 * 1024
_HOW = "(send multipart/form-data with a 'purpose' part (batch) and a 'file' part)"


class Refused(Exception):
    """An upload refused while it arrives: the 400's message."""


def file_routes() -> list[web.RouteDef]:
    return [
        web.post("/v1/files", upload),
        web.get("/v1/files", list_files),
        web.get("/v1/files/{file_id}", retrieve),
        web.get("/v1/files/{file_id}/content", content),
        web.delete("/v1/files/{file_id}", delete),
    ]


async def upload(request: web.Request) -> web.Response:
    files, path = request.app[FILES], request.path
    limit = request.app[GATEWAY].settings.gateway.max_file_bytes
    if not request.content_type.startswith("multipart/form-data"):
        return api_error(path, 400, f"the upload is not multipart/form-data {_HOW}")
    file_id, part_path = await asyncio.to_thread(files.new_upload)
    try:
        purpose, filename = await _read_form(request, part_path, limit)
        stored = await asyncio.to_thread(
            files.keep,
            file_id,
            part_path,
            owner=caller_of(request.app[GATEWAY], request),
            filename=filename,
            purpose=purpose,
        )
    except Refused as exc:
        return api_error(path, 400, str(exc))
    finally:
        with contextlib.suppress(OSError):
            part_path.unlink(missing_ok=True)
    return web.json_response(stored.wire())


async def _read_form(request: web.Request, part_path: Path, limit: int) -> tuple[str, str]:
    """Stream the form: the ``file`` part to ``part_path`` (at most ``limit`` bytes), the
    ``purpose`` part's value. Raises Refused saying what is wrong."""
    try:
        reader = await request.multipart()
    except (ValueError, AssertionError) as exc:
        raise Refused(f"the multipart body could not be read ({exc}) {_HOW}") from exc
    purpose, filename = "", ""
    got_file = False
    while True:
        try:
            part = await reader.next()
        except ValueError as exc:
            raise Refused(f"the multipart body could not be read ({exc}) {_HOW}") from exc
        if part is None:
            break
        if not isinstance(part, BodyPartReader):
            raise Refused(f"a form part may not be a multipart body of its own {_HOW}")
        if part.name == "purpose":
            purpose = (await part.text())[:64].strip()
        elif part.name == "file":
            filename, got_file = part.filename or "upload.jsonl", True
            await _stream(part, part_path, limit)
        else:
            await part.release()
    if not got_file:
        raise Refused(f"the form has no 'file' part {_HOW}")
    if purpose not in PURPOSES:
        raise Refused(f"purpose must be one of {', '.join(PURPOSES)}, not {purpose!r} {_HOW}")
    return purpose, filename


async def _stream(part: BodyPartReader, part_path: Path, limit: int) -> None:
    written = 0
    with part_path.open("wb") as out:
        while chunk := await part.read_chunk(_CHUNK_BYTES):
            written += len(chunk)
            if written > limit:
                raise Refused(
                    f"the file is larger than {limit} bytes (gateway.max_file_bytes); "
                    "split it into smaller batches"
                )
            await asyncio.to_thread(out.write, chunk)


def _owner(request: web.Request) -> str:
    return caller_of(request.app[GATEWAY], request)


def _not_found(request: web.Request, file_id: str) -> web.Response:
    return api_error(
        request.path, 404, f"no file {file_id[:80]!r} (see GET /v1/files)", type_="not_found"
    )


async def list_files(request: web.Request) -> web.Response:
    found = await asyncio.to_thread(
        request.app[FILES].list, _owner(request), request.query.get("purpose")
    )
    return web.json_response(
        {"object": "list", "data": [f.wire() for f in found], "has_more": False}
    )


async def _find(request: web.Request, file_id: str) -> StoredFile | None:
    if not _FILE_ID.match(file_id):
        return None
    return await asyncio.to_thread(request.app[FILES].get, file_id, _owner(request))


async def retrieve(request: web.Request) -> web.Response:
    file_id = request.match_info["file_id"]
    found = await _find(request, file_id)
    return web.json_response(found.wire()) if found else _not_found(request, file_id)


async def content(request: web.Request) -> web.StreamResponse:
    file_id = request.match_info["file_id"]
    files = request.app[FILES]
    if not await _find(request, file_id):
        return _not_found(request, file_id)
    return web.FileResponse(
        files.path(file_id), headers={"Content-Type": "application/octet-stream"}
    )


async def delete(request: web.Request) -> web.Response:
    file_id = request.match_info["file_id"]
    if not _FILE_ID.match(file_id) or not await asyncio.to_thread(
        request.app[FILES].delete, file_id, _owner(request)
    ):
        return _not_found(request, file_id)
    return web.json_response({"id": file_id, "object": "file", "deleted": True})
