"""Parts held by the other members, fetched over HTTP from the URL each member record names, as
versioned bytes (:mod:`rewardstream.processors.engine.partwire`): what a final or a snapshot
merges with this processor's own."""

from __future__ import annotations

import asyncio

import aiohttp

from rewardstream.errors import RewardstreamError
from rewardstream.infra.http_security import HttpSecurity
from rewardstream.processors.engine.partwire import PART_LIST_TYPE, ReceivedPart, decode_answer
from rewardstream.processors.engine.pipeline import Pipeline
from rewardstream.processors.engine.runs import PartView
from rewardstream.processors.stream.membership import Membership
from rewardstream.processors.stream.units import Units

__all__ = ["PART_TIMEOUT_S", "PeerParts", "Unavailable"]

PART_TIMEOUT_S = 120.0  # a peer's answer to a part request, when nothing tighter is asked
_PART_TIMEOUT = aiohttp.ClientTimeout(total=PART_TIMEOUT_S, sock_connect=5)


class Unavailable(RewardstreamError):
    """A unit's part cannot be had right now (no owner yet, owner unreachable or behind)."""


class PeerParts:
    """Owns the HTTP client to the peers (its token, their certificates checked) and the
    gathering of a run's parts from the owners of every unit not owned here. Parts never cross
    groups or prefixes: the member's identity is asked for and checked in every answer."""

    def __init__(
        self,
        pipeline: Pipeline,
        units: Units,
        membership: Membership,
        security: HttpSecurity,
    ) -> None:
        self.pipeline, self.units, self.membership = pipeline, units, membership
        self.security = security
        self._session: aiohttp.ClientSession | None = None

    async def gather(
        self, run_id: str, at_least: dict[str, int] | None = None, timeout: float = PART_TIMEOUT_S
    ) -> tuple[dict[str, PartView], dict[str, int]]:
        """The run's parts of every unit not owned here, from their owners, with the offset each
        covers; raises :class:`Unavailable` when a unit has no reachable owner, one that does
        not answer within ``timeout`` seconds (a frozen peer), or one behind ``at_least`` (a
        finished run's ends)."""
        every = self.units.every()
        if every is None:
            raise Unavailable("the data topics' partitions are not known yet")
        missing = every - set(self.pipeline.units)
        by_url: dict[str, set[str]] = {}
        for name in sorted(missing):
            owner = self.membership.owners.get(name)
            if owner is None or owner.member == self.membership.member or owner.url is None:
                raise Unavailable(f"partition {name} has no owner serving parts right now")
            by_url.setdefault(owner.url, set()).add(name)
        answers = await asyncio.gather(
            *(asyncio.wait_for(self._fetch_parts(url, run_id), timeout) for url in by_url),
            return_exceptions=True,
        )
        parts: dict[str, PartView] = {}
        offsets: dict[str, int] = {}
        for (url, names), answer in zip(by_url.items(), answers, strict=True):
            if isinstance(answer, TimeoutError):
                raise Unavailable(
                    f"partitions {', '.join(sorted(names))}: their owner {url} did not answer "
                    f"within {timeout:g} s"
                )
            if isinstance(answer, BaseException):
                raise Unavailable(f"cannot get parts from {url}: {answer}") from None
            positions, received = answer
            for name in names:
                if name not in positions:
                    raise Unavailable(f"{url} no longer owns partition {name}")
                offsets[name] = positions[name]
            parts |= {n: p for n, p in received.items() if n in names}
        for name, end in (at_least or {}).items():
            if offsets.get(name, end) < end:
                raise Unavailable(f"partition {name} is consumed to {offsets[name]} of {end}")
        return parts, offsets

    def open(self) -> aiohttp.ClientSession:
        """Start the session parts are fetched with (the token, and peers' certificates
        checked); the caller closes it."""
        self._session = aiohttp.ClientSession(
            timeout=_PART_TIMEOUT,
            headers=self.security.headers(),
            connector=aiohttp.TCPConnector(ssl=self.security.client_context()),
        )
        return self._session

    async def _fetch_parts(
        self, url: str, run_id: str
    ) -> tuple[dict[str, int], dict[str, ReceivedPart]]:
        assert self._session is not None
        if refused := self.security.refuses_peer(url):  # member records can be forged
            raise Unavailable(refused)
        name = self.security.peer_name if url.startswith("https://") else None
        async with self._session.get(
            f"{url}/parts/{run_id}",
            params=self.membership.identity(),
            server_hostname=name,
            allow_redirects=False,  # the token never follows a redirect elsewhere
        ) as response:
            body = await response.read()
            if response.status != 200 or response.content_type != PART_LIST_TYPE:
                raise Unavailable(f"HTTP {response.status}: {body[:200].decode(errors='replace')}")
        return decode_answer(body, {**self.membership.identity(), "run_id": run_id})
