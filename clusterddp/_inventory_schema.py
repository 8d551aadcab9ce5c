"""The inventory's YAML schema (pydantic), private to :mod:`clusterddp.inventory`.

Kept apart so that importing the inventory module (for `up local`, `--help`, a run record)
does not import pydantic; :func:`clusterddp.inventory.parse` loads it when a file is read.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from .inventory import ENV_NAME_RE, HOST_NAME_RE, LOCAL, show

# C0 controls, DEL and C1 controls: a newline or an escape sequence in a host address, a path or a
# glob is a mistake (or an attempt to forge terminal output); setup lines and env values may hold them.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _one_line(v: str) -> str:
    bad = _CONTROL.search(v)
    if bad:
        raise ValueError(f"holds the control character U+{ord(bad.group()):04X} at position {bad.start() + 1}; "
                         "remove it")
    return v


Line = Annotated[str, AfterValidator(_one_line)]


def _seconds(v: Any, most: float) -> Any:
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"must be a number of seconds, not {v}")
    if v > most:
        raise ValueError(f"must be at most {most:g} seconds")
    return v


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    user: Line | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    identity_file: Line | None = None
    known_hosts: Line | None = None
    host_key_policy: Literal["strict", "accept-new"] | None = None
    gpus: int | str | list[Any] | None = None  # a list is checked by _gpus
    python: Line | None = None
    workdir: Line | None = None
    env: dict[str, Any] | None = None
    setup: list[str] | None = None
    connect_timeout: float | int | None = Field(default=None, gt=0)
    keepalive: float | int | None = Field(default=None, ge=0)
    lease_dir: Line | None = None

    @field_validator("connect_timeout")
    @classmethod
    def _connect_timeout(cls, v: Any) -> Any:
        return _seconds(v, 3600)

    @field_validator("keepalive")
    @classmethod
    def _keepalive(cls, v: Any) -> Any:
        return _seconds(v, 3600)

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: Any) -> Any:
        if v is None or v == "auto":
            return v
        if isinstance(v, list):  # a fixed choice of GPUs (slots), e.g. [0, 1]
            if not v or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < 1024 for i in v):
                raise ValueError("a list of GPUs must hold GPU indices 0..1023, e.g. [0, 1]")
            if len(set(v)) != len(v):
                raise ValueError("lists a GPU twice")
            return v
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError("must be a whole number of processes (>= 1) or 'auto'")
        if v < 1:
            raise ValueError("must be >= 1 (processes per node) or 'auto'")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, Any] | None) -> dict[str, str] | None:
        if v is None:
            return v
        out = {}
        for k, val in v.items():
            if not isinstance(k, str) or not ENV_NAME_RE.fullmatch(k):
                raise ValueError(f"{show(str(k))} is not a valid environment variable name "
                                 "(letters, digits and _, not starting with a digit)")
            if isinstance(val, (list, dict)) or val is None:
                raise ValueError(f"{k}: value must be a string or a whole number, not "
                                 f"{'empty' if val is None else 'a list' if isinstance(val, list) else 'a mapping'}")
            if isinstance(val, bool) or not isinstance(val, (str, int)):
                raise ValueError(f"{k}: value must be a string or a whole number; quote it, e.g. {k}: \"{val}\"")
            out[k] = str(val)
        return out


class _HostEntry(_Settings):
    name: str
    address: Line | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not HOST_NAME_RE.fullmatch(v) or v == LOCAL:
            raise ValueError("must be 1 to 128 letters, digits, '.', '_' or '-' (it names a log file), "
                             "and not 'local'")
        return v


class _MasterEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    host: Line | None = None
    addr: Line | None = None
    port: int | None = Field(default=None, ge=1, le=65535)  # None: chosen free on the master, from 29500


class InventoryFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: Line | None = None
    defaults: _Settings = _Settings()
    master: _MasterEntry = _MasterEntry()
    collect: list[Line] = []
    fanout: int | None = Field(default=None, ge=1, le=1024)
    hosts: list[_HostEntry] = Field(min_length=1)
