"""The inventory's YAML schema (pydantic), private to :mod:`clusterddp.inventory`.

Kept apart so that importing the inventory module (for `up local`, `--help`, a run record)
does not import pydantic; :func:`clusterddp.inventory.parse` loads it when a file is read.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .inventory import ENV_NAME_RE, HOST_NAME_RE, LOCAL


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    user: str | None = None
    port: int | None = Field(None, ge=1, le=65535)
    identity_file: str | None = None
    known_hosts: str | None = None
    host_key_policy: Literal["strict", "accept-new"] | None = None
    gpus: int | str | None = None
    python: str | None = None
    workdir: str | None = None
    env: dict[str, Any] | None = None
    setup: list[str] | None = None
    connect_timeout: float | int | None = Field(None, gt=0)
    keepalive: float | int | None = Field(None, ge=0)

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: Any) -> Any:
        if v is None or v == "auto":
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
            if not isinstance(k, str) or not ENV_NAME_RE.match(k):
                raise ValueError(f"{k!r} is not a valid environment variable name")
            if isinstance(val, bool) or not isinstance(val, (str, int)):
                raise ValueError(f"{k}: value must be a string or a whole number; quote it, e.g. {k}: \"{val}\"")
            out[k] = str(val)
        return out


class _HostEntry(_Settings):
    name: str
    address: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not HOST_NAME_RE.match(v) or v == LOCAL:
            raise ValueError("must be letters, digits, '.', '_' or '-' (it names a log file), and not 'local'")
        return v


class _MasterEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    host: str | None = None
    addr: str | None = None
    port: int = Field(29500, ge=1, le=65535)


class InventoryFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str | None = None
    defaults: _Settings = _Settings()
    master: _MasterEntry = _MasterEntry()
    collect: list[str] = []
    fanout: int | None = Field(None, ge=1, le=1024)
    hosts: list[_HostEntry] = Field(min_length=1)
