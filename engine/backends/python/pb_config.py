"""`pb_utils.ModelConfig`: the config object a model's static `auto_complete_config` receives and returns.

It wraps the model config as Triton's JSON (a dict with `name`, `max_batch_size`, `input` and `output` at
least). The methods follow Triton's rules: `add_input` / `add_output` accept only their documented keys, merge
into an entry of the same name unless it contradicts it (a datatype or dims already set differently raise
ValueError), `set_max_batch_size` may not lower what the config set, `set_dynamic_batching` refuses another
scheduler. hubserve runs `auto_complete_config` in a short-lived process of its own (autocomplete.py), as
Triton does: nothing it creates survives into `initialize`.
"""

from __future__ import annotations

import json
from typing import Any

_INPUT_KEYS = ("name", "data_type", "dims", "optional")
_OUTPUT_KEYS = ("name", "data_type", "dims")


class ModelConfig:
    def __init__(self, model_config: str | dict[str, Any]) -> None:
        config = json.loads(model_config) if isinstance(model_config, str) else dict(model_config)
        config.setdefault("input", [])
        config.setdefault("output", [])
        config.setdefault("max_batch_size", 0)
        self._config = config

    @property
    def _name(self) -> str:
        return str(self._config.get("name", ""))

    def as_dict(self) -> dict[str, Any]:
        return self._config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        configured = int(self._config.get("max_batch_size", 0))
        if configured > max_batch_size:
            raise ValueError(f"configuration specified max_batch_size {configured}, but in "
                             f"auto-complete-config function for model '{self._name}' specified "
                             f"max_batch_size {max_batch_size}")
        self._config["max_batch_size"] = int(max_batch_size)

    def set_dynamic_batching(self) -> None:
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._config:
                raise ValueError(f"Configuration specified scheduling_choice as '{other}', but "
                                 f"auto-complete-config function for model '{self._name}' tries to set "
                                 "scheduling_choice as 'dynamic_batching'")
        self._config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:
        self._add("input", input, _INPUT_KEYS)

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output, _OUTPUT_KEYS)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(f"model transaction property in auto-complete-config function for model "
                                 f"'{self._name}' contains property other than 'decoupled'.")
        policy = self._config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = bool(transaction_policy_dict["decoupled"])
            if "decoupled" in policy and bool(policy["decoupled"]) != wanted:
                raise ValueError(f"trying to change decoupled property in auto-complete-config for model "
                                 f"'{self._name}', which is already set to '{policy['decoupled']}'.")
            policy["decoupled"] = wanted

    def _add(self, kind: str, entry: dict[str, Any], allowed: tuple[str, ...]) -> None:
        """Add `entry` to the config's `kind` list, or complete the entry of the same name."""
        name = entry.get("name")
        extra = [k for k in entry if k not in allowed]
        if extra:
            raise ValueError(f"{kind} '{name}' in auto-complete-config function for model '{self._name}' "
                             f"contains property other than {', '.join(repr(k) for k in allowed)}.")
        if name is None:
            raise ValueError(f"{kind} in auto-complete-config function for model '{self._name}' is "
                             "missing 'name' property.")
        for key in ("data_type", "dims"):
            if key not in entry:
                raise ValueError(f"{kind} '{name}' in auto-complete-config function for model "
                                 f"'{self._name}' is missing '{key}' property.")
        for current in self._config[kind]:
            if current.get("name") != name:
                continue
            have_type = current.get("data_type", "TYPE_INVALID")
            if have_type not in ("TYPE_INVALID", "", entry["data_type"]):
                raise ValueError(f"unable to load model '{self._name}', configuration expects datatype "
                                 f"{have_type} for {kind} '{name}', model provides {entry['data_type']}")
            have_dims = [int(d) for d in current.get("dims", [])]
            if have_dims and have_dims != [int(d) for d in entry["dims"]]:
                raise ValueError(f"model '{self._name}', tensor '{name}': the model expects dims "
                                 f"{list(entry['dims'])} but the model configuration specifies dims "
                                 f"{have_dims}")
            if "optional" in current and "optional" in entry and current["optional"] != entry["optional"]:
                raise ValueError(f"model '{self._name}', tensor '{name}': the model expects optional "
                                 f"{entry['optional']} but the model configuration specifies optional "
                                 f"{current['optional']}")
            current.update(entry)
            return
        self._config[kind].append(dict(entry))
