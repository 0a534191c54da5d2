"""FAKE Hugging Face Hub: a real aiohttp server on loopback that answers what the REAL
huggingface_hub 2.x client asks, so traylm's hub code and ``hf download`` run unmodified against
it (``HF_ENDPOINT=hub.url``). There is no internet here; this fake is the Hub's stand-in.

Served (read from the installed client's code: hf_api.py, file_download.py, utils/_http.py):
- ``GET /api/models`` (search: search, filter, author, pipeline_tag, sort, limit, expand)
- ``GET /api/models/{repo}`` and ``/api/models/{repo}/revision/{rev}`` (model info;
  ``blobs=True`` adds sizes and LFS sha256 to ``siblings``)
- ``GET /api/models/{repo}/tree/{rev}`` (recursive listing, cursor pagination with ``Link``)
- ``HEAD|GET /{repo}/resolve/{rev}/{path}``: git files answer 200 with ``ETag`` (git sha1),
  ``X-Repo-Commit`` and ``Content-Length``; LFS files answer 302 to a CDN on ANOTHER loopback
  address (127.0.0.2) with ``X-Linked-Etag`` (sha256) and ``X-Linked-Size``, like the real Hub, so
  the client drops the Authorization header on the way to the CDN
- ``HEAD|GET /cdn/{sha256}`` (the CDN): ``ETag``, ``Content-Length``, ``Range`` (206)
- errors with ``X-Error-Code`` (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo)

Faults (``hub.faults``): 5xx answers, stalls, truncated bodies, corrupted bytes (same size, wrong
sha256), bandwidth throttling. Big files are generated on the fly from a seed, never stored.
Every request is recorded (``hub.requests``) with its bytes sent and whether it carried a token.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import json
import random
import struct
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

BLOCK = 1 << 20
LFS_POINTER_SIZE = 134


@dataclass(frozen=True)
class FakeFile:
    path: str
    size: int
    lfs: bool
    read: Callable[[int, int], bytes]  # (offset, length) -> bytes
    sha256: str
    git_sha1: str


def _git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def bytes_file(path: str, data: bytes, *, lfs: bool | None = None) -> FakeFile:
    is_lfs = path.endswith(".safetensors") if lfs is None else lfs
    sha = hashlib.sha256(data).hexdigest()
    pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {len(data)}\n"
    return FakeFile(
        path=path,
        size=len(data),
        lfs=is_lfs,
        read=lambda off, n: data[off : off + n],
        sha256=sha,
        git_sha1=_git_sha1(pointer.encode() if is_lfs else data),
    )


class _Pattern:
    """Deterministic bytes: block i is a random 1 MiB block with i in its first 8 bytes."""

    def __init__(self, seed: int, prefix: bytes) -> None:
        self.base = random.Random(seed).randbytes(BLOCK)
        self.prefix = prefix
        self._last: tuple[int, bytes] = (-1, b"")

    def block(self, i: int) -> bytes:
        last_i, last = self._last  # sequential readers ask for the same block several times
        if last_i != i:
            last = struct.pack("<Q", i) + self.base[8:]
            self._last = (i, last)
        return last

    def read(self, offset: int, length: int) -> bytes:
        out = bytearray()
        if offset < len(self.prefix):
            out += self.prefix[offset : offset + length]
        pos = offset + len(out)
        while len(out) < length:
            i, within = divmod(pos, BLOCK)
            chunk = self.block(i)[within : within + length - len(out)]
            out += chunk
            pos += len(chunk)
        return bytes(out)


def generated_file(path: str, size: int, *, seed: int = 0, prefix: bytes = b"") -> FakeFile:
    """A file of ``size`` bytes made on the fly (its sha256 is computed once, here)."""
    pattern = _Pattern(seed, prefix)

    def read(offset: int, length: int) -> bytes:
        return pattern.read(offset, max(0, min(length, size - offset)))

    digest = hashlib.sha256()
    for off in range(0, size, 8 * BLOCK):
        digest.update(read(off, 8 * BLOCK))
    sha = digest.hexdigest()
    pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {size}\n"
    return FakeFile(path, size, True, read, sha, _git_sha1(pointer.encode()))


def safetensors_file(
    path: str, tensors: dict[str, tuple[str, tuple[int, ...]]], *, seed: int = 0
) -> FakeFile:
    """A valid safetensors file (header + generated data) with the given tensor shapes."""
    sizes = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "I32": 4, "U8": 1, "I8": 1}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for dim in shape:
            n *= dim
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    prefix = struct.pack("<Q", len(raw)) + raw
    return generated_file(path, len(prefix) + offset, seed=seed, prefix=prefix)


def safetensors_parameters(f: FakeFile) -> dict[str, int]:
    (length,) = struct.unpack("<Q", f.read(0, 8))
    header = json.loads(f.read(8, length))
    counts: dict[str, int] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        n = 1
        for dim in info["shape"]:
            n *= dim
        counts[info["dtype"]] = counts.get(info["dtype"], 0) + n
    return counts


@dataclass
class FakeRepo:
    repo_id: str
    files: dict[str, FakeFile]
    sha: str = ""
    gated: str = ""  # "" | "auto" | "manual"
    private: bool = False
    tags: tuple[str, ...] = ("transformers", "safetensors", "text-generation")
    downloads: int = 0
    likes: int = 0
    license: str = "apache-2.0"
    pipeline_tag: str = "text-generation"
    last_modified: str = "2025-01-01T00:00:00.000Z"
    branches: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.sha:
            self.sha = hashlib.sha1(self.repo_id.encode()).hexdigest()
        self.branches.setdefault("main", self.sha)

    @classmethod
    def from_folder(cls, repo_id: str, folder: Path, **kw: Any) -> FakeRepo:
        files = {
            p.relative_to(folder).as_posix(): bytes_file(
                p.relative_to(folder).as_posix(), p.read_bytes()
            )
            for p in sorted(folder.rglob("*"))
            if p.is_file()
        }
        return cls(repo_id, files, **kw)

    def parameters(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for f in self.files.values():
            if f.path.endswith(".safetensors") and "/" not in f.path:
                for dtype, n in safetensors_parameters(f).items():
                    counts[dtype] = counts.get(dtype, 0) + n
        return counts

    def config(self) -> dict[str, Any]:
        f = self.files.get("config.json")
        return json.loads(f.read(0, f.size)) if f else {}


@dataclass
class RequestRecord:
    method: str
    path: str
    status: int
    host: str
    range: str | None
    auth: bool
    bytes_sent: int = 0


@dataclass
class _Fault:
    kind: str  # fail | stall | truncate | corrupt
    pattern: str
    times: int | None  # None: every time
    status: int = 500
    after_bytes: int = 0
    seconds: float | None = None
    methods: tuple[str, ...] = ("GET",)


class Faults:
    """Thread-safe fault switchboard. Patterns are fnmatch globs on the request path."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[_Fault] = []
        self.throttle_bytes_per_s: float | None = None
        self.throttle_pattern = "*"
        self._release = threading.Event()

    def fail(
        self,
        pattern: str,
        *,
        status: int = 500,
        times: int | None = 1,
        methods: Iterable[str] = ("GET", "HEAD"),
    ) -> None:
        self._add(_Fault("fail", pattern, times, status=status, methods=tuple(methods)))

    def stall(
        self, pattern: str, *, after_bytes: int, seconds: float | None = None, times: int | None = 1
    ) -> None:
        """Send ``after_bytes`` of the body, then nothing for ``seconds`` (None: until release)."""
        self._release.clear()
        self._add(_Fault("stall", pattern, times, after_bytes=after_bytes, seconds=seconds))

    def truncate(self, pattern: str, *, after_bytes: int, times: int | None = 1) -> None:
        self._add(_Fault("truncate", pattern, times, after_bytes=after_bytes))

    def corrupt(self, pattern: str, *, times: int | None = None) -> None:
        """Serve the file with one byte flipped (same size, wrong sha256)."""
        self._add(_Fault("corrupt", pattern, times))

    def throttle(self, bytes_per_s: float | None, pattern: str = "*") -> None:
        self.throttle_bytes_per_s = bytes_per_s
        self.throttle_pattern = pattern

    def release_stalls(self) -> None:
        self._release.set()

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()
        self.throttle_bytes_per_s = None
        self._release.set()

    def _add(self, fault: _Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def take(self, kind: str, path: str, method: str) -> _Fault | None:
        with self._lock:
            for f in self._faults:
                if f.kind == kind and method in f.methods and fnmatch.fnmatch(path, f.pattern):
                    if f.times is not None:
                        f.times -= 1
                        if f.times <= 0:
                            self._faults.remove(f)
                    return f
        return None


class FakeHub:
    """Start with ``start()`` (a thread with its own event loop); ``url`` is the endpoint."""

    def __init__(self, *, tokens: dict[str, set[str]] | None = None, page_size: int = 1000) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.tokens = tokens if tokens is not None else {"hf_test_token": {"*"}}
        self.page_size = page_size
        self.faults = Faults()
        self.requests: list[RequestRecord] = []
        self.url = ""
        self.cdn_url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    def add_repo(self, repo: FakeRepo) -> FakeRepo:
        self.repos[repo.repo_id] = repo
        return repo

    def bytes_served(self, suffix: str = "") -> int:
        return sum(r.bytes_sent for r in list(self.requests) if r.path.endswith(suffix))

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> FakeHub:
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._serve())
            except BaseException as exc:
                errors.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup() if self._runner else asyncio.sleep(0))
            loop.close()

        self._thread = threading.Thread(target=run, name="fake-hub", daemon=True)
        self._thread.start()
        ready.wait(10)
        if errors:
            raise errors[0]
        return self

    def stop(self) -> None:
        self.faults.release_stalls()
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    async def _serve(self) -> None:
        from tests.fakes.hub_routes import build_app

        app = build_app(self)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        try:
            cdn = web.TCPSite(self._runner, "127.0.0.2", 0)
            await cdn.start()
            cdn_port = cdn._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.cdn_url = f"http://127.0.0.2:{cdn_port}"
        except OSError:
            self.cdn_url = self.url

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def tiny_llama_repo(
    repo_id: str = "traylm-test/tiny-llama",
    *,
    weight_bytes: int = 4 << 20,
    shards: int = 2,
    layers: int = 4,
    kv_heads: int = 2,
    extra: dict[str, FakeFile] | None = None,
    **kw: Any,
) -> FakeRepo:
    """A Llama-shaped repo with valid safetensors shards, a pickle copy (never to be fetched),
    docs, and an ``original/`` folder; weights are generated, not stored."""
    hidden, heads, vocab = 256, 4, 1000
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": 512,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "vocab_size": vocab,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
    }
    files: dict[str, FakeFile] = {}
    per_shard = weight_bytes // shards // 2
    weight_map: dict[str, str] = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        tensor = f"model.layers.{i}.weight"
        files[name] = safetensors_file(name, {tensor: ("BF16", (per_shard // 64, 64))}, seed=i + 1)
        weight_map[tensor] = name
    index = {"metadata": {"total_size": weight_bytes}, "weight_map": weight_map}
    small = {
        "config.json": json.dumps(config).encode(),
        "generation_config.json": b'{"bos_token_id": 1, "eos_token_id": 2}',
        "tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE", "vocab": {}}}',
        "tokenizer_config.json": b'{"model_max_length": 4096}',
        "special_tokens_map.json": b"{}",
        "model.safetensors.index.json": json.dumps(index).encode(),
        "README.md": b"# tiny llama\n",
        ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
        "original/params.json": b"{}",
    }
    for path, data in small.items():
        files[path] = bytes_file(path, data)
    files["pytorch_model.bin"] = generated_file("pytorch_model.bin", 1 << 20, seed=99)
    files.update(extra or {})
    return FakeRepo(repo_id, files, **kw)


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll a condition from a synchronous test (the fake runs in its own thread)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.02)
