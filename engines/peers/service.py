"""PeersFeature: this box's identity, the boxes paired with it, pairing, and the listener for
paired boxes (mutual TLS, bound only while a box is paired or a pairing is on).

The exchange (docs/architecture/flows/pairing.md): the box that shows the code (server) listens; the
box that joins reads the server's certificate on a first TLS contact, then sends its own
certificate, a nonce and a proof of the code bound to both fingerprints over TLS that trusts
only the certificate it read; the server checks the proof, pins the client and answers with
its own proof, which the client checks before it pins the server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import ssl
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from engines.config.live import SettingsView
from engines.config.profiles import NAME_RULE, check_name, valid_name
from engines.config.sections import PeersSettings
from engines.errors import ConfigError, PairingRefused, PeerError, PeerNotFound, quoted
from engines.events.peers import PairingCode, PairingState, PeerInfo, PeersView, Unpaired
from engines.peers import exchange, link, store, tls
from engines.peers.listener import PeerListener, host_name, join_address, lan_addresses
from engines.peers.store import Peer

log = logging.getLogger(__name__)

MAX_EXPIRES_S = 3600.0


@dataclass
class _Pairing:
    code: str
    deadline: float  # loop time
    attempts_left: int
    timer: asyncio.TimerHandle


class PeersFeature:
    """Pairing and the paired boxes. Constructed without I/O; ``start`` reads (or makes) the
    identity and the peers file."""

    name = "peers"

    def __init__(
        self,
        *,
        settings: SettingsView,
        folder: Path,
        peer_app: Callable[[PeersFeature], web.Application],
    ) -> None:
        """``folder``: where the identity (identity/) and peers.json live; ``peer_app``: the
        listener's application (routes.peer_app)."""
        self._settings = settings
        self._folder = folder
        self._peer_app = peer_app
        self._identity: tls.Identity | None = None
        self._peers: dict[str, Peer] = {}
        self._pairing: _Pairing | None = None
        self._spent: deque[tuple[str, str]] = deque(maxlen=16)  # (code, what spent it)
        self._outcome = ""
        self._listener = PeerListener()
        self._tasks: set[asyncio.Task[None]] = set()
        self._client_contexts: dict[str, ssl.SSLContext] = {}  # by the peer's fingerprint
        self._paired = asyncio.Event()  # set when a box is paired (until_paired)

    @property
    def settings(self) -> PeersSettings:
        return self._settings.current.peers

    @property
    def box_name(self) -> str:
        return self.settings.name or host_name()

    def _own_name(self) -> str:
        """This box's name, checked before another box is asked to keep it."""
        name = self.box_name
        if not valid_name(name):
            raise ConfigError(
                f"this box's name {name!r} (peers.name) is not a valid box name: use "
                f"{NAME_RULE}; `traylm config set peers.name NAME`"
            )
        return name

    @property
    def identity(self) -> tls.Identity:
        if self._identity is None:
            raise PeerError("the peers feature has not started yet; try again in a moment")
        return self._identity

    @property
    def _peers_file(self) -> Path:
        return self._folder / "peers.json"

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        self._identity = await asyncio.to_thread(
            tls.load_or_create, self._folder / "identity", self.box_name
        )
        peers, damaged = await asyncio.to_thread(store.load_or_set_aside, self._peers_file)
        if damaged:
            log.error("%s", damaged)
        for peer in peers:
            if tls.fingerprint_pem(peer.cert_pem) != peer.fingerprint:
                log.error(
                    "%s: %s's certificate does not match its fingerprint; skipped (pair it again)",
                    self._peers_file,
                    peer.name,
                )
                continue
            self._peers[peer.name] = peer
        if self._peers:
            try:
                await self._listen()
            except PeerError as exc:
                log.error("%s", exc.message)

    async def stop(self) -> None:
        self._end_pairing("was cancelled: the daemon stopped")
        for task in self._tasks:
            task.cancel()
        if self._peers:
            await asyncio.to_thread(store.save, self._peers_file, list(self._peers.values()))
        await self._listener.close()

    def status(self) -> dict[str, object]:
        return {
            "listening": self._listener.address,
            "paired": len(self._peers),
            "pairing": self._pairing is not None,
        }

    # ----------------------------------------------------------------- the listener

    async def _listen(self) -> None:
        s = self.settings
        ctx = tls.server_context(self.identity, [p.cert_pem for p in self._peers.values()])
        await self._listener.open(lambda: self._peer_app(self), ctx, s.host, s.port)

    async def _close_if_idle(self) -> None:
        """Nothing listens on the LAN once no box is paired and no pairing is on."""
        if not self._peers and self._pairing is None:
            await self._listener.close()

    def _later(self, coro: Callable[[], Any]) -> None:
        """Run ``coro()`` after the current handler (the listener cannot close under it)."""
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ----------------------------------------------------------------- pairing: this box shows

    async def begin_pairing(self, expires_in_s: float | None = None) -> PairingCode:
        """A new one-time code (any earlier one is spent) and the listener, until the code is
        used, expires or is cancelled."""
        ttl = self.settings.pairing_timeout_s if expires_in_s is None else float(expires_in_s)
        if not 1 <= ttl <= MAX_EXPIRES_S:
            raise ConfigError(f"expires_in_s must be 1 to {MAX_EXPIRES_S:.0f} seconds, not {ttl}")
        identity = self.identity
        self._own_name()
        self._end_pairing("was replaced by a newer code")
        loop = asyncio.get_running_loop()
        code = exchange.new_code()
        self._pairing = _Pairing(
            code,
            loop.time() + ttl,
            self.settings.pairing_attempts,
            loop.call_later(ttl, self._expire),
        )
        self._outcome = ""
        try:
            await self._listen()
        except PeerError:
            self._end_pairing("was cancelled: the listener could not start")
            raise
        s = self.settings
        hosts = [s.host]
        if s.host in ("0.0.0.0", "::", ""):  # noqa: S104
            hosts = await asyncio.to_thread(lan_addresses) or [host_name()]
        address = join_address(hosts[0], s.port)
        return PairingCode(
            code=exchange.shown(code),
            expires_in_s=ttl,
            address=address,
            addresses=tuple(join_address(h, s.port) for h in hosts),
            fingerprint=tls.shown(identity.fingerprint),
            qr=f"traylm-pair://{address}/{code}?fp={identity.fingerprint}",
        )

    def pairing(self) -> PairingState:
        p = self._pairing
        if p is None:
            return PairingState(active=False, expires_in_s=0.0, outcome=self._outcome)
        left = max(0.0, p.deadline - asyncio.get_running_loop().time())
        return PairingState(active=True, expires_in_s=left, outcome="")

    async def cancel_pairing(self) -> PairingState:
        self._end_pairing("was cancelled")
        await self._close_if_idle()
        return self.pairing()

    def _expire(self) -> None:
        self._end_pairing("expired")
        self._later(self._close_if_idle)

    def _end_pairing(self, why: str) -> None:
        p, self._pairing = self._pairing, None
        if p is not None:
            p.timer.cancel()
            self._spent.append((p.code, why))
            self._outcome = f"the code {why}"

    def refuse_without_a_code(self) -> None:
        """Before the joining box's request is read (routes.py): refused at once when no code
        can match (none shown now, none spent to name). A code that is shown is checked
        against the proof, which the body carries."""
        pairing = self._pairing
        if pairing is not None and asyncio.get_running_loop().time() >= pairing.deadline:
            self._end_pairing("expired")
            pairing = None
        if pairing is None and not self._spent:
            self._refuse(None, None)

    async def accept_pairing(self, body: Mapping[str, Any], remote: str) -> dict[str, str]:
        """The joining box's request (routes.py, on the listener): pins it when its proof
        matches the code shown here; the answer carries this box's proof. The proof is
        checked first, against the certificate's bytes as sent: a request without the code
        is refused as a wrong code (a try spent) whatever else it holds, and only a request
        with it has its other fields and its certificate read."""
        client_fp = tls.claimed_fingerprint(body.get("cert"))
        nonce, proof = (exchange.text(body.get(k)) for k in ("nonce", "proof"))
        server_fp = self.identity.fingerprint

        def expected(code: str) -> str:
            return exchange.proof(code, "client", server_fp, client_fp, nonce)

        pairing = self._pairing
        if pairing is not None and asyncio.get_running_loop().time() >= pairing.deadline:
            self._end_pairing("expired")
            pairing = None
        if not client_fp or pairing is None or not exchange.matches(expected(pairing.code), proof):
            spent = (w for c, w in self._spent if exchange.matches(expected(c), proof))
            self._refuse(pairing, next(spent, None) if client_fp else None)
        assert pairing is not None
        name, port, cert, nonce, proof = exchange.parse_request(body)
        if tls.fingerprint_pem(cert) != client_fp:
            raise ConfigError("the pairing request's cert is not one PEM certificate")
        if client_fp == server_fp:
            raise PairingRefused("a box cannot pair with itself")
        known = self._peers.get(name)
        if known is not None and known.fingerprint != client_fp:
            raise PeerError(
                f"a box named {name!r} is already paired with {self.box_name}; unpair it there "
                f"first (`traylm unpair {name}`), or give the new box another name "
                "(`traylm config set peers.name NAME` on it)"
            )
        self._end_pairing(f"was already used (to pair with {name})")
        self._outcome = f"paired with {name}"
        now = time.time()
        await self._add(Peer(name, join_address(remote, port), client_fp, cert, now, now))
        log.info("paired with %s (%s)", name, tls.shown(client_fp))
        return {
            "name": self.box_name,
            "proof": exchange.proof(pairing.code, "server", server_fp, client_fp, nonce),
        }

    def _refuse(self, pairing: _Pairing | None, spent_why: str | None) -> None:
        again = f"run `traylm pair` on {self.box_name} for a new code"
        if spent_why is not None:
            raise PairingRefused(f"this pairing code {spent_why}; {again}")
        if pairing is None:
            raise PairingRefused(
                f"no pairing is in progress on {self.box_name} (a code is valid once, for "
                f"{self.settings.pairing_timeout_s:.0f} s); {again}"
            )
        pairing.attempts_left -= 1
        if pairing.attempts_left <= 0:
            self._end_pairing("was spent by too many wrong codes")
            self._later(self._close_if_idle)
            raise PairingRefused(f"the pairing code is wrong, and that was the last try; {again}")
        raise PairingRefused(
            f"the pairing code is wrong ({pairing.attempts_left} tries left); check it on "
            f"{self.box_name}'s screen"
        )

    # ----------------------------------------------------------------- pairing: this box joins

    async def join(self, address: str, typed_code: str) -> PeerInfo:
        """Pair with the box at ``address`` that shows ``typed_code``."""
        identity = self.identity
        code = exchange.normalise(typed_code)
        if code is None:
            raise ConfigError(
                f"{typed_code[:40]!r} is not a pairing code: it has {exchange.CODE_LENGTH} "
                "letters and digits (e.g. ABCDE-FGHJK), as `traylm pair` shows on the other box"
            )
        host, port = link.split_address(address, self.settings.port)
        where = join_address(host, port)
        server_der = await link.first_contact(host, port, where, self.settings.request_timeout_s)
        server_pem, server_fp = tls.pem_of(server_der), tls.fingerprint_der(server_der)
        nonce = secrets.token_hex(16)
        body = {
            "protocol": exchange.PROTOCOL,
            "name": self._own_name(),
            "port": self.settings.port,
            "cert": identity.cert_pem,
            "nonce": nonce,
            "proof": exchange.proof(code, "client", server_fp, identity.fingerprint, nonce),
        }
        answer = await link.post_pairing(
            where, tls.client_context(None, server_pem), body, self.settings.request_timeout_s
        )
        mine = exchange.proof(code, "server", server_fp, identity.fingerprint, nonce)
        if not exchange.matches(mine, answer.get("proof")):
            raise PairingRefused(
                f"the box at {where} did not prove it knows the code: another machine may be "
                f"between the boxes (it showed certificate {tls.shown(server_fp)[:19]}...); "
                "nothing was paired here. Compare that with the fingerprint `traylm pair` shows"
            )
        name = check_name(exchange.text(answer.get("name")), "box")
        known = self._peers.get(name)
        if known is not None and known.fingerprint != server_fp:
            raise PeerError(
                f"this box already has another box named {name!r} paired; `traylm unpair {name}` "
                "here and pair again"
            )
        now = time.time()
        peer = Peer(name, where, server_fp, server_pem, now, now)
        await self._add(peer)
        log.info("paired with %s at %s (%s)", name, where, tls.shown(server_fp))
        return _info(peer, reachable=True)

    # ----------------------------------------------------------------- paired boxes

    async def _add(self, peer: Peer) -> None:
        self._peers[peer.name] = peer
        self._paired.set()
        self._listener.trust(peer.cert_pem)
        await asyncio.to_thread(store.save, self._peers_file, list(self._peers.values()))
        await self._listen()

    def peer(self, name: str) -> Peer:
        peer = self._peers.get(check_name(name, "box"))
        if peer is None:
            raise PeerNotFound(f"no paired box is named {quoted(name)}; `traylm peers` lists them")
        return peer

    def by_fingerprint(self, fingerprint: str) -> Peer | None:
        return next((p for p in self._peers.values() if p.fingerprint == fingerprint), None)

    def seen(self, peer: Peer) -> None:
        if peer.name in self._peers:
            self._peers[peer.name] = dataclasses.replace(peer, last_seen_s=time.time())

    def names(self) -> list[str]:
        """The paired boxes' names."""
        return list(self._peers)

    async def until_paired(self) -> None:
        """Return once a box is paired (at once when one is): what works with paired boxes
        waits here while there are none, instead of polling."""
        while not self._peers:
            self._paired.clear()
            await self._paired.wait()

    def client_context(self, name: str) -> ssl.SSLContext:
        """The TLS context to a paired box: this box's certificate presented, only the box's
        pinned one trusted."""
        peer = self.peer(name)
        ctx = self._client_contexts.get(peer.fingerprint)
        if ctx is None:  # made once per peer: it reads this box's key from disk
            ctx = tls.client_context(self.identity, peer.cert_pem)
            self._client_contexts[peer.fingerprint] = ctx
        return ctx

    def session(self, name: str) -> aiohttp.ClientSession:
        """An HTTP session to a paired box (mutual TLS, its certificate pinned), each request
        bounded by peers.request_timeout_s. Close it."""
        ctx = self.client_context(name)
        return link.open_session(ctx, self.peer(name), self.settings.request_timeout_s)

    async def view(self, *, check: bool = True) -> PeersView:
        """This box and its paired boxes; ``check``: ask each whether it is there (at once)."""
        peers = list(self._peers.values())
        infos = (
            await asyncio.gather(*(self._check(p) for p in peers))
            if check
            else [_info(p) for p in peers]
        )
        return PeersView(
            name=self.box_name,
            fingerprint=tls.shown(self.identity.fingerprint),
            listening=self._listener.address,
            peers=tuple(infos),
        )

    async def _check(self, peer: Peer) -> PeerInfo:
        try:
            async with self.session(peer.name) as http, http.get("/peer/hello") as resp:
                await resp.read()
                if resp.status != 200:
                    return _info(peer, reachable=False, problem=_refused_text(peer, resp.status))
        except (aiohttp.ClientError, TimeoutError) as exc:
            return _info(peer, reachable=False, problem=link.explain(peer, exc).message)
        self.seen(peer)
        return _info(self._peers.get(peer.name, peer), reachable=True)

    async def unpair(self, name: str) -> Unpaired:
        """Remove a paired box here (always) and there (when it answers)."""
        peer = self.peer(name)
        removed_there, detail = False, ""
        try:
            async with self.session(peer.name) as http, http.post("/peer/unpair") as resp:
                await resp.read()
                removed_there = resp.status == 200
                detail = "" if removed_there else _refused_text(peer, resp.status)
        except (aiohttp.ClientError, TimeoutError) as exc:
            detail = link.explain(peer, exc).message
        await self._remove(peer)
        if not removed_there:
            detail += f"; it may still list this box: run `traylm unpair {self.box_name}` there"
        return Unpaired(name=peer.name, removed_there=removed_there, detail=detail)

    async def forget(self, peer: Peer) -> None:
        """The paired box ``peer`` unpaired itself (routes.py, on the listener)."""
        log.info("%s unpaired itself", peer.name)
        await self._remove(peer, close_later=True)

    async def _remove(self, peer: Peer, *, close_later: bool = False) -> None:
        self._peers.pop(peer.name, None)
        await asyncio.to_thread(store.save, self._peers_file, list(self._peers.values()))
        if close_later:
            self._later(self._close_if_idle)
        else:
            await self._close_if_idle()


def _info(peer: Peer, *, reachable: bool | None = None, problem: str = "") -> PeerInfo:
    return PeerInfo(
        name=peer.name,
        address=peer.address,
        fingerprint=tls.shown(peer.fingerprint),
        paired_at_s=peer.paired_at_s,
        last_seen_s=peer.last_seen_s,
        reachable=reachable,
        problem=problem,
    )


def _refused_text(peer: Peer, status: int) -> str:
    return (
        f"box {peer.name!r} at {peer.address} refused this box (HTTP {status}): it no longer "
        f"has it paired; `traylm unpair {peer.name}` and pair the boxes again"
    )
