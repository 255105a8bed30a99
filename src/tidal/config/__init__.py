"""The typed config tree and its loader."""

from tidal.config.load import (
    apply_overrides,
    config_from_dict,
    load_config,
    save_config,
)
from tidal.config.schema import TidalConfig

__all__ = ["TidalConfig", "apply_overrides", "config_from_dict", "load_config", "save_config"]
