"""Routes of the FAKE Hugging Face Hub (tests/fakes/hub_server.py): the metadata API, the
resolve endpoint, the CDN, error headers and fault injection while streaming bodies."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlencode

from aiohttp import web

from tests.fakes.hub_server import LFS_POINTER_SIZE, FakeFile, FakeRepo, RequestRecord

if TYPE_CHECKING:
    from tests.fakes.hub_server import FakeHub

HUB: web.AppKey[FakeHub] = web.AppKey("hub")
RECORD: web.RequestKey[RequestRecord] = web.RequestKey("record", RequestRecord)
CHUNK = 1 << 20


def build_app(hub: FakeHub) -> web.Application:
    app = web.Application(middlewares=[_record])
    app[HUB] = hub
    app.router.add_get("/api/models", search)
    app.router.add_get("/api/models/{org}/{name}", info)
    app.router.add_get("/api/models/{org}/{name}/revision/{rev}", info)
    app.router.add_get("/api/models/{org}/{name}/tree/{rev}", tree)
    app.router.add_route("*", "/{org}/{name}/resolve/{rev}/{path:.+}", resolve)
    app.router.add_route("*", "/cdn/{sha}", cdn)
    return app


@web.middleware
async def _record(request: web.Request, handler: Any) -> web.StreamResponse:
    hub = request.app[HUB]
    rec = RequestRecord(
        request.method,
        request.path,
        0,
        request.host,
        request.headers.get("Range"),
        "Authorization" in request.headers,
    )
    hub.requests.append(rec)
    request[RECORD] = rec
    fault = hub.faults.take("fail", request.path, request.method)
    if fault is not None:
        rec.status = fault.status
        return web.Response(status=fault.status, text=f"injected {fault.status}")
    try:
        resp: web.StreamResponse = await handler(request)
    except web.HTTPException as exc:
        rec.status = exc.status
        raise
    rec.status = resp.status
    return resp


def _error(status: int, code: str, message: str, commit: str | None = None) -> web.Response:
    headers = {"X-Error-Code": code, "X-Error-Message": message}
    if commit:
        headers["X-Repo-Commit"] = commit
    return web.json_response({"error": message}, status=status, headers=headers)


def _token(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    return auth[7:] if auth.startswith("Bearer ") else None


def _repo(request: web.Request) -> FakeRepo | web.Response:
    hub = request.app[HUB]
    repo_id = f"{request.match_info['org']}/{request.match_info['name']}"
    repo = hub.repos.get(repo_id)
    token = _token(request)
    if repo is None or (repo.private and not _granted(hub, token, repo_id)):
        status = 404 if token else 401
        return _error(status, "RepoNotFound", "Repository not found")
    return repo


def _granted(hub: FakeHub, token: str | None, repo_id: str) -> bool:
    granted = hub.tokens.get(token or "", set())
    return "*" in granted or repo_id in granted


def _commit(repo: FakeRepo, rev: str) -> str | None:
    rev = unquote(rev)
    if rev in repo.branches:
        return repo.branches[rev]
    return rev if rev in repo.branches.values() else None


def _summary(repo: FakeRepo) -> dict[str, Any]:
    params = repo.parameters()
    return {
        "_id": repo.sha[:24],
        "id": repo.repo_id,
        "modelId": repo.repo_id,
        "author": repo.repo_id.split("/")[0],
        "sha": repo.sha,
        "lastModified": repo.last_modified,
        "createdAt": repo.last_modified,
        "private": repo.private,
        "gated": repo.gated or False,
        "disabled": False,
        "downloads": repo.downloads,
        "likes": repo.likes,
        "library_name": "transformers",
        "tags": list(repo.tags),
        "pipeline_tag": repo.pipeline_tag,
        "safetensors": {"parameters": params, "total": sum(params.values())} if params else None,
    }


async def search(request: web.Request) -> web.Response:
    hub = request.app[HUB]
    q = request.query
    found = list(hub.repos.values())
    if q.get("search"):
        found = [r for r in found if q["search"].lower() in r.repo_id.lower()]
    for tag in q.getall("filter", []):
        found = [r for r in found if tag in r.tags]
    if q.get("author"):
        found = [r for r in found if r.repo_id.split("/")[0] == q["author"]]
    if q.get("pipeline_tag"):
        found = [r for r in found if r.pipeline_tag == q["pipeline_tag"]]
    found = [r for r in found if not r.private]
    key = {"downloads": "downloads", "likes": "likes", "lastModified": "last_modified"}.get(
        q.get("sort", ""), ""
    )
    if key:
        found.sort(key=lambda r: getattr(r, key), reverse=True)
    limit = int(q.get("limit", "1000"))
    return web.json_response([_summary(r) for r in found[:limit]])


async def info(request: web.Request) -> web.Response:
    repo = _repo(request)
    if isinstance(repo, web.Response):
        return repo
    rev = request.match_info.get("rev", "main")
    commit = _commit(repo, rev)
    if commit is None:
        return _error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
    data = _summary(repo)
    data["sha"] = commit
    data["cardData"] = {"license": repo.license}
    cfg = repo.config()
    data["config"] = {k: cfg[k] for k in ("architectures", "model_type") if k in cfg}
    blobs = request.query.get("blobs") in ("True", "true", "1")
    data["siblings"] = [_sibling(f, blobs) for f in repo.files.values()]
    return web.json_response(data)


def _sibling(f: FakeFile, blobs: bool) -> dict[str, Any]:
    if not blobs:
        return {"rfilename": f.path}
    out: dict[str, Any] = {"rfilename": f.path, "size": f.size, "blobId": f.git_sha1}
    if f.lfs:
        out["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": LFS_POINTER_SIZE}
    return out


async def tree(request: web.Request) -> web.Response:
    hub = request.app[HUB]
    repo = _repo(request)
    if isinstance(repo, web.Response):
        return repo
    commit = _commit(repo, request.match_info["rev"])
    if commit is None:
        return _error(404, "RevisionNotFound", "Invalid rev id")
    recursive = request.query.get("recursive") in ("True", "true", "1")
    entries: list[dict[str, Any]] = []
    folders: set[str] = set()
    for f in sorted(repo.files.values(), key=lambda f: f.path):
        if "/" in f.path:
            folder = f.path.split("/")[0]
            if folder not in folders:
                folders.add(folder)
                entries.append({"type": "directory", "oid": "0" * 40, "size": 0, "path": folder})
            if not recursive:
                continue
        entry: dict[str, Any] = {"type": "file", "oid": f.git_sha1, "size": f.size, "path": f.path}
        if f.lfs:
            entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": LFS_POINTER_SIZE}
        entries.append(entry)
    start = int(request.query.get("cursor", "0"))
    page = entries[start : start + hub.page_size]
    headers = {}
    if start + hub.page_size < len(entries):
        params = {**request.query, "cursor": str(start + hub.page_size)}
        headers["Link"] = f'<{hub.url}{request.path}?{urlencode(params)}>; rel="next"'
    return web.json_response(page, headers=headers)


async def resolve(request: web.Request) -> web.StreamResponse:
    hub = request.app[HUB]
    repo = _repo(request)
    if isinstance(repo, web.Response):
        return repo
    commit = _commit(repo, request.match_info["rev"])
    if commit is None:
        return _error(404, "RevisionNotFound", "Invalid rev id")
    path = unquote(request.match_info["path"])
    f = repo.files.get(path)
    if f is None:
        return _error(404, "EntryNotFound", f"{path} does not exist", commit)
    if repo.gated or repo.private:
        token = _token(request)
        if token is None:
            message = f"Access to model {repo.repo_id} is restricted. You must be authenticated."
            return _error(401, "GatedRepo", message, commit)
        if not _granted(hub, token, repo.repo_id):
            message = f"Access to model {repo.repo_id} is restricted and you are not in the list."
            return _error(403, "GatedRepo", message, commit)
    headers = {"X-Repo-Commit": commit, "Accept-Ranges": "bytes"}
    if f.lfs:
        headers.update(
            {
                "X-Linked-Etag": f'"{f.sha256}"',
                "X-Linked-Size": str(f.size),
                "ETag": f'"{f.git_sha1}"',
                "Location": f"{hub.cdn_url}/cdn/{f.sha256}?expires={int(time.time()) + 3600}",
            }
        )
        return web.Response(status=302, headers=headers)
    headers["ETag"] = f'"{f.git_sha1}"'
    return await _body(request, f, headers)


async def cdn(request: web.Request) -> web.StreamResponse:
    hub = request.app[HUB]
    sha = request.match_info["sha"]
    for repo in hub.repos.values():
        for f in repo.files.values():
            if f.lfs and f.sha256 == sha:
                return await _body(request, f, {"ETag": f'"{sha}"', "Accept-Ranges": "bytes"})
    return web.Response(status=404, text="no such blob")


def _range(header: str | None, size: int) -> tuple[int, int] | None:
    if not header or not header.startswith("bytes="):
        return None
    first, _, last = header[6:].split(",")[0].partition("-")
    if not first:
        return max(0, size - int(last)), size - 1
    return int(first), min(int(last), size - 1) if last else size - 1


async def _body(request: web.Request, f: FakeFile, headers: dict[str, str]) -> web.StreamResponse:
    hub = request.app[HUB]
    rng = _range(request.headers.get("Range"), f.size)
    start, end = rng if rng else (0, f.size - 1)
    if rng and start >= f.size:
        return web.Response(status=416, headers={"Content-Range": f"bytes */{f.size}"})
    status = 206 if rng else 200
    length = max(0, end - start + 1)
    if rng:
        headers["Content-Range"] = f"bytes {start}-{end}/{f.size}"
    headers["Content-Length"] = str(length)
    headers["Content-Type"] = "application/octet-stream"
    if request.method == "HEAD":
        return web.Response(status=status, headers=headers)
    resp = web.StreamResponse(status=status, headers=headers)
    await resp.prepare(request)
    await _stream(request, hub, f, resp, start, length)
    return resp


async def _stream(
    request: web.Request,
    hub: FakeHub,
    f: FakeFile,
    resp: web.StreamResponse,
    start: int,
    length: int,
) -> None:
    rec = request[RECORD]
    path = request.path
    stall = hub.faults.take("stall", path, "GET")
    truncate = hub.faults.take("truncate", path, "GET")
    corrupt = hub.faults.take("corrupt", path, "GET")
    sent = 0
    began = time.monotonic()
    while sent < length:
        n = min(CHUNK, length - sent)
        if truncate is not None and sent + n > truncate.after_bytes:
            n = max(0, truncate.after_bytes - sent)
        if stall is not None and sent + n > stall.after_bytes >= sent:
            n = stall.after_bytes - sent
        data = f.read(start + sent, n)
        if corrupt is not None and start + sent <= f.size // 2 < start + sent + n:
            i = f.size // 2 - start - sent
            data = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :]
        if data:
            await resp.write(data)
            sent += len(data)
            rec.bytes_sent += len(data)
        if truncate is not None and sent >= truncate.after_bytes:
            assert request.transport is not None
            request.transport.abort()
            return
        if stall is not None and sent >= stall.after_bytes:
            await _wait_stall(hub, stall.seconds)
            stall = None
        await _throttle(hub, path, sent, began)


async def _wait_stall(hub: FakeHub, seconds: float | None) -> None:
    deadline = time.monotonic() + (seconds if seconds is not None else 3600)
    while time.monotonic() < deadline and not hub.faults._release.is_set():
        await asyncio.sleep(0.05)


async def _throttle(hub: FakeHub, path: str, sent: int, began: float) -> None:
    import fnmatch

    rate = hub.faults.throttle_bytes_per_s
    if rate and fnmatch.fnmatch(path, hub.faults.throttle_pattern):
        ahead_s = sent / rate - (time.monotonic() - began)
        if ahead_s > 0:
            await asyncio.sleep(ahead_s)
