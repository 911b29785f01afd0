"""capd's process: config, the CLI, and (next) the Unix-socket daemon."""

from ._config import CapdConfig, LoadedConfig, load_config

__all__ = ["CapdConfig", "LoadedConfig", "load_config"]
