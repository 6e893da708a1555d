"""The calibration file: a policy per traffic domain and a global one, as YAML the decoder loads.

`calibrate.py` finds the policies and measures them; this module is the file's schema: it
parses and checks a file (every policy through DecodeConfig, unknown keys refused), answers
`policy_for(domain)` and `configs_for(prompts)`, and writes a file atomically, never over an
existing one unless asked.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from dspark_bench.config import POLICY_FIELDS, DecodeConfig, from_dict
from dspark_bench.errors import DsparkError, first_line
from dspark_bench.results import atomic_write, write_text
from dspark_bench.tasks.prompts import Prompt

SCHEMA_VERSION = 1
# "engine": how the policies were evaluated, in files written before it was called "evaluation".
TOP_LEVEL_KEYS = ("schema_version", "created", "environment", "spec", "models", "objective", "evaluation", "engine",
                  "sampling", "max_new_tokens", "cost_model", "global", "domains", "figure", "by_batch_size",
                  "profiles")


@dataclass(frozen=True)
class DomainCalibration:
    policy: DecodeConfig
    measured: dict = field(default_factory=dict)  # everything else the file says about the domain


@dataclass(frozen=True)
class Calibration:
    """A loaded calibration file: a policy per domain and a global policy for the rest."""

    global_policy: DecodeConfig
    domains: dict[str, DomainCalibration]
    models: dict
    objective: str
    path: Path | None = None
    data: dict = field(default_factory=dict, repr=False)  # the file as read
    # Calibrations at other batch sizes (calibrate --batch-size ...), each with its own policies.
    by_batch_size: dict[int, "Calibration"] = field(default_factory=dict, repr=False)

    @property
    def batch_size(self) -> int:
        return self.global_policy.batching.batch_size

    def for_batch_size(self, batch_size: int) -> "Calibration":
        """The calibration made at the batch size nearest `batch_size` (the smaller on a tie):
        a serving engine's per-batch-size table is read the same way."""
        choices = {self.batch_size: self, **self.by_batch_size}
        nearest = min(choices, key=lambda b: (abs(b - batch_size), b))
        return dataclasses.replace(choices[nearest], path=self.path)

    def policy_for(self, domain: str, strict: bool = False, base: DecodeConfig | None = None) -> DecodeConfig:
        """The domain's policy; an unknown domain gets the global policy (or an error if strict).

        With `base`, only the policy knobs (POLICY_FIELDS) are taken from the calibration and
        the rest (max_new_tokens, temperature, top_p, seed) stay the base's.
        """
        if domain in self.domains:
            policy = self.domains[domain].policy
        elif strict:
            raise DsparkError(f"calibration {self._where()} has no domain {domain!r}; "
                              f"it has: {', '.join(self.domains) or 'none'}")
        else:
            policy = self.global_policy
        if base is None:
            return policy
        return base.replace(**{name: policy.to_dict()[name] for name in POLICY_FIELDS})

    def configs_for(self, prompts: list[Prompt], strict: bool = False,
                    base: DecodeConfig | None = None) -> list[DecodeConfig]:
        """One config per prompt, keyed on the prompt's category (its domain)."""
        return [self.policy_for(p.category, strict, base) for p in prompts]

    def groups(self, prompts: list[Prompt], strict: bool = False,
               base: DecodeConfig | None = None) -> list[tuple[DecodeConfig, list[Prompt]]]:
        """Prompts grouped by the config they get, in first-seen order (one runner call each)."""
        grouped: dict[DecodeConfig, list[Prompt]] = {}
        for prompt, config in zip(prompts, self.configs_for(prompts, strict, base)):
            grouped.setdefault(config, []).append(prompt)
        return list(grouped.items())

    def check_models(self, models: dict) -> None:
        """Refuse a pair other than the one the calibration was made with (by fingerprint)."""
        for key in ("target_fingerprint", "draft_fingerprint"):
            if self.models.get(key) and models.get(key) and self.models[key] != models[key]:
                raise DsparkError(f"calibration {self._where()} was made with another {key.split('_')[0]} model "
                                  f"({self.models[key]} vs {models[key]}); calibrate again")

    def _where(self) -> str:
        return repr(str(self.path)) if self.path else "(in memory)"


def _policy(data: object, where: str) -> DecodeConfig:
    if not isinstance(data, dict):
        raise DsparkError(f"{where}: policy must be a mapping of DecodeConfig fields")
    try:
        return from_dict(data)
    except DsparkError as err:
        raise DsparkError(f"{where}: invalid policy: {err}") from None
    except TypeError as err:  # a value of the wrong type, e.g. a list for a threshold
        raise DsparkError(f"{where}: invalid policy: {err}") from None


def parse_calibration(data: object, where: str = "calibration") -> Calibration:
    if not isinstance(data, dict):
        raise DsparkError(f"{where}: a calibration file must be a mapping")
    unknown = sorted(set(map(str, data)) - set(TOP_LEVEL_KEYS))
    if unknown:
        raise DsparkError(f"{where}: unknown top-level key(s) {', '.join(unknown)}; known: {', '.join(TOP_LEVEL_KEYS)}")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise DsparkError(f"{where}: schema_version {data.get('schema_version')!r} is not supported "
                          f"(this version reads {SCHEMA_VERSION}); calibrate again")
    missing = [key for key in ("models", "global", "domains") if key not in data]
    if missing:
        raise DsparkError(f"{where}: missing key(s) {', '.join(missing)}")
    global_policy, domains = _policies(data["global"], data["domains"], where)
    models = data["models"] if isinstance(data["models"], dict) else {}
    by_batch_size = {}
    extra = data.get("by_batch_size") or {}
    if not isinstance(extra, dict):
        raise DsparkError(f"{where}: by_batch_size must be a mapping of batch size -> global and domains")
    for size, part in extra.items():
        here = f"{where}: by_batch_size {size}"
        if not isinstance(part, dict) or "global" not in part or "domains" not in part:
            raise DsparkError(f"{here}: must be a mapping with global and domains")
        policy, policies = _policies(part["global"], part["domains"], here)
        batch_size = policy.batching.batch_size
        if str(batch_size) != str(size):
            raise DsparkError(f"{here}: its global policy has batch_size {batch_size}")
        if batch_size == global_policy.batching.batch_size or batch_size in by_batch_size:
            raise DsparkError(f"{here}: batch size {batch_size} is calibrated twice")
        by_batch_size[batch_size] = Calibration(policy, policies, models, str(data.get("objective", "speedup")))
    return Calibration(global_policy, domains, models, str(data.get("objective", "speedup")), data=data,
                       by_batch_size=by_batch_size)


def _policies(entry: object, entries: object, where: str) -> tuple[DecodeConfig, dict[str, DomainCalibration]]:
    """The global policy and each domain's, from a file's global and domains entries."""
    if not isinstance(entry, dict) or "policy" not in entry:
        raise DsparkError(f"{where}: global must be a mapping with a policy")
    global_policy = _policy(entry["policy"], f"{where}: global")
    if not isinstance(entries, dict):
        raise DsparkError(f"{where}: domains must be a mapping of domain -> entry")
    domains = {}
    for name, entry in entries.items():
        if not isinstance(entry, dict) or "policy" not in entry:
            raise DsparkError(f"{where}: domain {name!r} must be a mapping with a policy")
        if not isinstance(entry["policy"], dict):
            raise DsparkError(f"{where}: domain {name!r}: policy must be a mapping of DecodeConfig fields")
        # A domain's entry names the policy's knobs; verification settings come from the global policy.
        policy = _policy({**global_policy.to_dict(), **entry["policy"]}, f"{where}: domain {name!r}")
        domains[str(name)] = DomainCalibration(policy, {k: v for k, v in entry.items() if k != "policy"})
    return global_policy, domains


def load_calibration(path: str | Path) -> Calibration:
    """Read and validate a calibration file; any problem is one DsparkError line."""
    path = Path(path)
    if not path.is_file():
        raise DsparkError(f"calibration file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise DsparkError(f"{path}: not valid YAML ({first_line(err)})") from None
    except (OSError, UnicodeDecodeError) as err:
        raise DsparkError(f"{path}: cannot read ({err})") from None
    return dataclasses.replace(parse_calibration(data, str(path)), path=path)


def profiles_folder(out: Path) -> Path:
    """Where a replay calibration's acceptance profiles go: `<file stem>-profiles/` beside the file."""
    return Path(out).with_name(Path(out).stem + "-profiles")


def check_output(out: Path, force: bool, profiles: bool = True) -> tuple[Path, Path]:
    """The calibration file and its figure; refuse to overwrite either, or (`profiles`) the profiles
    folder beside them, unless `force`."""
    out = Path(out)
    figure = out.with_suffix(".png")
    if not force:
        for path in (out, figure, *([profiles_folder(out)] if profiles else [])):
            if path.exists():
                raise DsparkError(f"{str(path)!r} already exists; pass --force to overwrite it")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DsparkError(f"cannot create {str(out.parent)!r}: {err.strerror or err}") from None
    if not os.access(out.parent, os.W_OK):
        raise DsparkError(f"output folder {str(out.parent)!r} is not writable")
    return out, figure


def write_calibration(data: dict, figure, out: Path, force: bool = False) -> Path:
    """Write the YAML (and the figure beside it) under temporary names, then rename into place."""
    out, figure_path = check_output(out, force, profiles=False)  # its profiles are written just before it
    parse_calibration(data, str(out))  # never write a file the loader would refuse
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    if figure is not None:
        atomic_write(figure_path, lambda partial: figure.savefig(partial, format="png"))
    return write_text(out, text)
