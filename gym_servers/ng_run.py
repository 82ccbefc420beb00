"""``ng_run "+config_paths=[a.yaml,b.yaml]" [+key=value ...]``: start the servers of a config.

As NeMo Gym's ``gym env start`` (docs/nemo-gym-compat.md §Head server): the YAML files are
merged in order, then the overrides; ``${dotted.key}`` values are resolved and a leftover ``???``
fails. Every server gets
host ``127.0.0.1`` and a free port in [10001, 20000] unless it names one, and is started as
``NEMO_GYM_CONFIG_DICT=<yaml> NEMO_GYM_CONFIG_PATH=<name> python -m <entrypoint>`` (an
``entrypoint`` ending in ``.py`` is run as a file, relative to its config file). A head server
(``head_server.{host,port}``, default 127.0.0.1:11000) lists them on ``/server_instances`` and
serves the merged config, secrets redacted, on ``/global_config_dict_yaml``. As in 0.7.0, an
agent no ``environment_servers`` block fronts gets a generated ``legacy_agent`` relay (with a
deprecation warning; :mod:`rewardstream.gym_servers.environments`). Once every server
answers its health check, one line says so; Ctrl-C or SIGTERM stops them all. A value that
cannot be used (a port that is no number, a reference to itself) is one line naming its key.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, cast

import yaml
from aiohttp import ClientError, ClientSession, ClientTimeout, web

from rewardstream.errors import InputError
from rewardstream.gym_servers.base import (
    DEFAULT_HOST,
    SERVER_TYPES,
    ServerSpec,
    base_app,
    json_response,
    redacted,
    server_specs,
)
from rewardstream.gym_servers.environments import deprecation, front_agents
from rewardstream.infra.command import override_command
from rewardstream.infra.overrides import parse_overrides

__all__ = ["BUNDLED_CONFIG", "ServerGroup", "load_config", "main", "merged_config"]

BUNDLED_CONFIG = Path(__file__).resolve().parent / "configs" / "arithmetic.yaml"
# NeMo Gym implementations this package runs itself, by (server type, implementation)
_BUILTIN = {("environment_servers", "legacy_agent"): "rewardstream.gym_servers.environment_server"}
DEFAULT_HEAD = {"host": DEFAULT_HOST, "port": 11000}
PORT_RANGE = (10001, 20000)
_CONFIG_DIR_KEY = "_config_dir"  # where a server's .py entrypoint is looked up
_USAGE = f"""\
usage: ng_run "+config_paths=[config.yaml,...]" [+key=value ...]

Start the servers of a NeMo Gym config, each as a process on 127.0.0.1 and a free port, and a
head server listing them (/server_instances); Ctrl-C or SIGTERM stops them all.

overrides (+key=value, ++key=value or key=value; dotted keys nest; ${{key}} is key's value):
  +config_paths=[PATH,...]       (required) the YAML configs, merged in order
  +head_server.host=HOST         the head server's address ({DEFAULT_HEAD["host"]})
  +head_server.port=PORT         its port ({DEFAULT_HEAD["port"]})
  +policy_base_url=URL           bundled config: proxy this OpenAI-compatible endpoint
                                 instead of the simulated policy (null: simulated)
  +policy_api_key=KEY            bundled config: the endpoint's API key (never shown)
  +policy_model_name=NAME        bundled config: the model asked for (simulated-policy)
  +NAME.TYPE.IMPL.host=HOST      a server's address ({DEFAULT_HOST})
  +NAME.TYPE.IMPL.port=PORT      a server's port (default: free, {PORT_RANGE[0]}-{PORT_RANGE[1]})
  +NAME.TYPE.IMPL.entrypoint=M   the module to run (a .py file: relative to its config)
  +KEY=VALUE                     any other key of the merged config

options:
  -h, --help                     show this help and exit
  --version                      show the version and exit

bundled config: {BUNDLED_CONFIG}"""


def _resolved(layers: list[dict[str, Any]]) -> dict[str, Any]:
    """The layers merged and interpolated with OmegaConf, as NeMo Gym merges its configs:
    later layers win, mappings merge key by key, anything else is replaced; ``${a.b}``
    anywhere in a string, ``${oc.env:VAR}`` and the other resolvers; ``???`` is required. A
    value that cannot be resolved is one line naming its key."""
    from omegaconf import OmegaConf
    from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

    try:
        merged = OmegaConf.merge(*(OmegaConf.create(layer) for layer in layers))
        out = OmegaConf.to_container(merged, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as exc:
        raise InputError(f"config key {exc.full_key!r} is required (still '???')") from None
    except OmegaConfBaseException as exc:  # an interpolation: missing key, cycle, bad grammar
        message = " ".join((str(exc).splitlines() or [""])[0].split())  # then its context
        raise InputError(f"config key {getattr(exc, 'full_key', '')!r}: {message}") from None
    assert isinstance(out, dict)
    return cast(dict[str, Any], out)


def _env_yaml() -> list[dict[str, Any]]:
    """``env.yaml`` of the working folder (secrets and endpoints kept out of the configs), the
    layer 0.7.0 puts between the configs and the command line."""
    path = Path("env.yaml")
    if not path.is_file():
        return []
    return [_yaml(path)]


def _yaml(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise InputError(f"Cannot read config '{path}': {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise InputError(f"Invalid YAML in '{path}': {' '.join(str(exc).split())}") from None
    if not isinstance(loaded, dict):
        raise InputError(f"Config '{path}' is not a mapping")
    return loaded


def _port(value: Any, key: str, free: bool) -> int | None:
    """A port from the config: an integer (digits in a string too) in 1-65535; ``free``: null
    or 0 means "pick one"."""
    if free and value in (None, 0, ""):
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise InputError(f"invalid {key}={value!r}: expected a port number (1-65535)")
    return value


def _host(value: Any, key: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise InputError(f"invalid {key}={value!r}: expected a host name or address")
    return value


def _check_addresses(config: dict[str, Any]) -> None:
    """Check (and type) every host and port ng_run reads, naming the key at fault: a bad one
    would otherwise fail deep inside start-up, as a traceback."""
    head = config.get("head_server")
    if head is None:
        head = {}
    if not isinstance(head, dict):
        raise InputError(f"invalid head_server={head!r}: expected a mapping with host and port")
    if "port" in head:
        head["port"] = _port(head["port"], "head_server.port", free=False)
    if "host" in head:
        _host(head["host"], "head_server.host")
    for spec in server_specs(config):
        where = f"{spec.name}.{spec.server_type}.{spec.impl}"
        if not isinstance(spec.config, dict):
            raise InputError(f"invalid {where}={spec.config!r}: expected a server's mapping")
        if "port" in spec.config:
            spec.config["port"] = _port(spec.config["port"], f"{where}.port", free=True)
        if "host" in spec.config:
            _host(spec.config["host"], f"{where}.host")


def load_config(tokens: Sequence[str]) -> dict[str, Any]:
    """The merged config of ``+config_paths=[...]`` and the other overrides."""
    return merged_config(parse_overrides(list(tokens)))


def merged_config(overrides: dict[str, Any]) -> dict[str, Any]:
    """The merged config of parsed overrides: their ``config_paths``, then the rest."""
    paths = overrides.pop("config_paths", [])
    if isinstance(paths, str):
        paths = [paths]
    if not paths:
        raise InputError("no config given: pass +config_paths=[path/to/config.yaml,...]")
    if not isinstance(paths, list) or not all(isinstance(p, str) and p for p in paths):
        raise InputError(f"invalid config_paths={paths!r}: expected [path/to/config.yaml,...]")
    layers = []
    for path in paths:
        loaded = _yaml(Path(path))
        for spec in server_specs(loaded):
            spec.config.setdefault(_CONFIG_DIR_KEY, str(Path(path).resolve().parent))
        layers.append(loaded)
    resolved = _resolved([*layers, *_env_yaml(), overrides])
    if not server_specs(resolved):
        raise InputError(f"no servers in {', '.join(map(str, paths))}")
    _check_addresses(resolved)
    generated = front_agents(resolved)
    if generated:
        print(deprecation(generated), file=sys.stderr, flush=True)
    return resolved


def _free_port(taken: set[int]) -> int:
    rng = random.Random()
    while True:
        port = rng.randint(*PORT_RANGE)
        if port in taken:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        taken.add(port)
        return port


def _entry(spec: ServerSpec) -> str:
    """The module or ``.py`` file that runs ``spec``: NeMo Gym's own implementations that this
    package provides (``legacy_agent``'s ``app.py``) map to the module here."""
    entry = str(spec.config.get("entrypoint") or "")
    builtin = _BUILTIN.get((spec.server_type, spec.impl))
    if builtin is not None and entry in ("", "app.py"):
        return builtin
    if not entry:
        raise InputError(f"server {spec.name!r} has no entrypoint")
    return entry


def _command(spec: ServerSpec) -> list[str]:
    entry = _entry(spec)
    if entry.endswith(".py"):
        return [sys.executable, str(Path(spec.config.get(_CONFIG_DIR_KEY, ".")) / entry)]
    return [sys.executable, "-m", entry]


def _dir_path(spec: ServerSpec) -> str | None:
    """Where the server's code is (NeMo Gym's ``dir_path``)."""
    entry = _entry(spec)
    if entry.endswith(".py"):
        return spec.config.get(_CONFIG_DIR_KEY)
    found = importlib.util.find_spec(entry)
    return str(Path(found.origin).parent) if found is not None and found.origin else None


class ServerGroup:
    """The servers of one config as child processes, plus the head server (in this process).

    ``log``: where the children's output goes (default: inherited). Use as an async context
    manager: entering starts everything and waits for health; leaving stops everything.
    """

    def __init__(self, config: dict[str, Any], log: IO[bytes] | None = None) -> None:
        self.config = config
        self.log = log
        self.head = {**DEFAULT_HEAD, **(config.get("head_server") or {})}
        self.head["host"] = self.head.get("host") or DEFAULT_HOST  # null/"": all interfaces
        self.config["head_server"] = self.head
        taken: set[int] = {int(self.head["port"])}
        self.specs = server_specs(config)
        for spec in self.specs:
            spec.config["host"] = spec.config.get("host") or DEFAULT_HOST
            if not spec.config.get("port"):
                spec.config["port"] = _free_port(taken)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.started: dict[str, float] = {}
        self._runner: web.AppRunner | None = None

    @property
    def head_url(self) -> str:
        return f"http://{self.head['host']}:{self.head['port']}"

    def url(self, name: str) -> str:
        return next(s.url for s in self.specs if s.name == name)

    async def __aenter__(self) -> ServerGroup:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self, timeout: float = 60.0) -> None:
        dump = yaml.safe_dump(self.config, sort_keys=False)
        for spec in self.specs:  # another server on a port would answer its health check
            _check_free(spec.name, str(spec.config["host"]), int(spec.config["port"]))
        for spec in self.specs:
            env = {**os.environ, "NEMO_GYM_CONFIG_DICT": dump, "NEMO_GYM_CONFIG_PATH": spec.name}
            self.procs[spec.name] = subprocess.Popen(
                _command(spec), env=env, stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL
            )
            self.started[spec.name] = time.time()
        runner = self._runner = web.AppRunner(self._head_app(), access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.head["host"], int(self.head["port"])).start()
        except OSError as exc:
            raise InputError(f"head server cannot listen on {self.head_url}: {exc}") from None
        await self._wait_healthy(timeout)

    async def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        waiting = {s.name: s.url for s in self.specs}
        async with ClientSession(timeout=ClientTimeout(total=2)) as session:
            while waiting:
                for name, url in list(waiting.items()):
                    code = self.procs[name].poll()
                    if code is not None:
                        raise InputError(f"server {name!r} exited with code {code} while starting")
                    try:
                        async with session.get(f"{url}/health") as resp:
                            if resp.status == 200:
                                del waiting[name]
                    except (ClientError, TimeoutError):
                        pass
                if waiting and time.monotonic() > deadline:
                    raise InputError(f"servers not healthy after {timeout:.0f}s: {sorted(waiting)}")
                if waiting:
                    await asyncio.sleep(0.05)

    async def stop(self) -> None:
        """SIGTERM every child, SIGKILL what is left after 10 s; then close the head server.
        Callers stop before what they call (environment servers, agents, resources servers,
        models): a request in flight when a collection is interrupted finishes against servers
        still up, where stopping all at once failed it with a traceback in the log."""
        deadline = time.monotonic() + 10
        for kind in reversed(SERVER_TYPES):
            procs = [
                self.procs[s.name]
                for s in self.specs
                if s.server_type == kind and s.name in self.procs
            ]
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
            for proc in procs:
                while proc.poll() is None and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def instances(self) -> list[dict[str, Any]]:
        """``/server_instances``: one entry per server, NeMo Gym 0.7.0's fields in its order
        and meaning: ``name`` is the implementation (``simple_agent``), ``process_name`` and
        ``config_path`` the instance (``arithmetic_simple_agent``); the head is not listed."""
        return [
            {
                "config_path": s.name,
                "dir_path": _dir_path(s),
                "entrypoint": s.config.get("entrypoint"),
                "host": s.config["host"],
                "name": s.impl,
                "pid": self.procs[s.name].pid if s.name in self.procs else None,
                "port": s.config["port"],
                "process_name": s.name,
                "server_type": s.server_type,
                "start_time": self.started.get(s.name),
                "status": None,
                "uptime_seconds": None,
                "url": s.url,
            }
            for s in self.specs
        ]

    def _head_app(self) -> web.Application:
        app = base_app()

        async def instances(_: web.Request) -> web.Response:
            return json_response(self.instances())

        async def config_yaml(_: web.Request) -> web.Response:
            return json_response(yaml.safe_dump(redacted(self.config), sort_keys=False))

        app.router.add_get("/server_instances", instances)
        app.router.add_get("/global_config_dict_yaml", config_yaml)
        return app


def _check_free(name: str, host: str, port: int) -> None:
    """Refuse a server's port that something already listens on: that something would answer
    the server's health check, and the group would be "ready" with the server dead."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp binds
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as exc:
            raise InputError(
                f"server {name!r} cannot listen on {host}:{port}: {exc.strerror}"
            ) from None


async def _serve(config: dict[str, Any]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with ServerGroup(config) as group:
        for inst in group.instances():
            where = f"{inst['server_type']}/{inst['name']}"
            print(f"{inst['process_name']} ({where}) at {inst['url']} pid={inst['pid']}")
        print(f"All {len(group.specs)} servers ready! Head server: {group.head_url}", flush=True)
        await stop.wait()
        print("Stopping servers...", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    def serve(args: list[str]) -> int:
        asyncio.run(_serve(load_config(args)))
        return 0

    return override_command("ng_run", lambda: _USAGE, argv, serve)


if __name__ == "__main__":
    sys.exit(main())
