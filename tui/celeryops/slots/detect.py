"""What this worker host has: CPUs (the affinity mask, capped by a cgroup CPU quota) and GPU devices (NVML when
nvidia-ml-py is installed and a driver answers, else ``nvidia-smi -L``), restricted by ``CUDA_VISIBLE_DEVICES`` /
``NVIDIA_VISIBLE_DEVICES``; explicit totals (``CELERYOPS_SLOTS_<TYPE>=N``) win.

A device is named the way ``docker run --gpus device=...`` and ``CUDA_VISIBLE_DEVICES`` take it: a whole GPU by its
index (an int, as nvidia-smi numbers it), a MIG device by its UUID (``"MIG-..."``; a GPU in MIG mode counts as its
MIG devices). ``gpu: N`` set by hand means devices ``0 .. N-1``.

Every probe takes its inputs as arguments with the real defaults (the cgroup root, the environment, the NVML module,
the nvidia-smi command), so tests hand in fake ones; ``detect`` also says where each number came from
(``Detected.notes``), which the worker logs once at start.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DeviceId = int | str
CGROUP_ROOT = "/sys/fs/cgroup"
SELF_CGROUP = "/proc/self/cgroup"


# -- CPU ---------------------------------------------------------------------------------------------------------
def affinity_count() -> int:
    """CPUs this process may run on (the affinity mask in a container), else os.cpu_count()."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cgroup_cpu_limit(cgroup_root: str | Path = CGROUP_ROOT, self_cgroup: str | Path = SELF_CGROUP) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (``cpu.max`` of cgroup v2, ``cpu.cfs_quota_us`` /
    ``cpu.cfs_period_us`` of v1), the smallest along the path from its cgroup up to the root; None: no quota."""
    root = Path(cgroup_root)
    paths = _own_cgroup_paths(Path(self_cgroup))
    limits: list[float] = []
    if (root / "cgroup.controllers").exists() or (root / "cpu.max").exists():  # v2 (unified)
        for d in _ancestors(root, paths.get("", "/")):
            limits += _v2_limit(d / "cpu.max")
    else:  # v1: the cpu controller's own hierarchy
        rel = next((p for ctl, p in paths.items() if "cpu" in ctl.split(",")), "/")
        for mount in ("cpu,cpuacct", "cpu", "cpuacct,cpu"):
            if (root / mount).is_dir():
                for d in _ancestors(root / mount, rel):
                    limits += _v1_limit(d)
                break
    return min(limits) if limits else None


def _own_cgroup_paths(self_cgroup: Path) -> dict[str, str]:
    """``/proc/self/cgroup``: controllers -> path (``""`` is the unified v2 hierarchy)."""
    out: dict[str, str] = {}
    try:
        text = self_cgroup.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            out[parts[1]] = parts[2] or "/"
    return out


def _ancestors(base: Path, rel: str) -> list[Path]:
    """``base/a/b``, ``base/a``, ``base``: the cgroup and every parent that exists under this mount (inside a
    container the process's path from the host's view may not exist: then only the mount's own files count)."""
    parts = [p for p in rel.split("/") if p]
    out = []
    for i in range(len(parts), -1, -1):
        d = base.joinpath(*parts[:i])
        if d.is_dir():
            out.append(d)
    return out


def _v2_limit(cpu_max: Path) -> list[float]:
    try:
        quota, _, period = cpu_max.read_text().strip().partition(" ")
    except OSError:
        return []
    if quota == "max":
        return []
    try:
        q, p = float(quota), float(period or 100000)
    except ValueError:
        return []
    return [q / p] if q > 0 and p > 0 else []


def _v1_limit(d: Path) -> list[float]:
    try:
        q = float((d / "cpu.cfs_quota_us").read_text().strip())
        p = float((d / "cpu.cfs_period_us").read_text().strip())
    except (OSError, ValueError):
        return []
    return [q / p] if q > 0 and p > 0 else []


def cpu_count(cgroup_root: str | Path = CGROUP_ROOT, self_cgroup: str | Path = SELF_CGROUP) -> int:
    """The smaller of the affinity mask and the cgroup CPU quota, rounded down, at least 1."""
    return _cpu(cgroup_root, self_cgroup)[0]


def _cpu(cgroup_root: str | Path, self_cgroup: str | Path) -> tuple[int, str]:
    mask = affinity_count()
    quota = cgroup_cpu_limit(cgroup_root, self_cgroup)
    if quota is None or quota >= mask:
        return mask, f"cpu {mask} (affinity mask" + (")" if quota is None else f"; cgroup quota {quota:g} CPUs)")
    n = max(1, math.floor(quota))
    return n, f"cpu {n} (cgroup quota {quota:g} CPUs, affinity mask {mask})"


# -- GPU ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Gpu:
    """A device a task can be given: ``id`` is what it is called by (index of a whole GPU, UUID of a MIG device);
    ``index`` and ``gpu_uuid`` the GPU it is on; ``mig`` its MIG index on that GPU (None: a whole GPU)."""

    id: DeviceId
    index: int
    uuid: str = ""
    name: str = ""
    mig: int | None = None
    gpu_uuid: str = ""


_SMI_GPU = re.compile(r"^GPU (\d+): (.*?)\s*\(UUID: ([^)]+)\)")
_SMI_MIG = re.compile(r"^\s+MIG .*?Device\s+(\d+): \(UUID: ([^)]+)\)")


def parse_smi(text: str) -> list[Gpu]:
    """``nvidia-smi -L``: one line per GPU, then one indented line per MIG device of a GPU in MIG mode."""
    whole: list[Gpu] = []
    migs: dict[int, list[Gpu]] = {}
    current: Gpu | None = None
    for line in text.splitlines():
        if m := _SMI_GPU.match(line):
            current = Gpu(int(m[1]), int(m[1]), m[3].strip(), m[2].strip(), gpu_uuid=m[3].strip())
            whole.append(current)
        elif (m := _SMI_MIG.match(line)) and current is not None:
            migs.setdefault(current.index, []).append(Gpu(m[2].strip(), current.index, m[2].strip(), current.name,
                                                          int(m[1]), current.uuid))
    return _flatten(whole, migs)


def _flatten(whole: list[Gpu], migs: Mapping[int, list[Gpu]]) -> list[Gpu]:
    out: list[Gpu] = []
    for g in whole:
        out += migs.get(g.index) or [g]
    return out


def nvml_devices(nvml: Any) -> list[Gpu]:
    """The devices an initialised NVML module (pynvml, or a stand-in with the same functions) reports."""
    whole: list[Gpu] = []
    migs: dict[int, list[Gpu]] = {}
    for i in range(int(nvml.nvmlDeviceGetCount())):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        uuid = _text(nvml.nvmlDeviceGetUUID(h))
        whole.append(Gpu(i, i, uuid, _text(nvml.nvmlDeviceGetName(h)), gpu_uuid=uuid))
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(h)
        except Exception:  # NVMLError_NotSupported: a GPU without MIG
            continue
        if not current:
            continue
        for j in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(h))):
            try:
                mh = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
            except Exception:  # NVMLError_NotFound: no MIG device in that slot
                continue
            mig_uuid = _text(nvml.nvmlDeviceGetUUID(mh))
            migs.setdefault(i, []).append(Gpu(mig_uuid, i, mig_uuid, whole[-1].name, j, uuid))
    return _flatten(whole, migs)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _probe_nvml(nvml: Any) -> tuple[list[Gpu] | None, str]:
    """(devices, how) from NVML; (None, why not) when there is no NVML or it does not start."""
    if nvml is None:
        try:
            import pynvml  # the optional extra (nvidia-ml-py)
        except ImportError:
            return None, "nvidia-ml-py is not installed"
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound / DriverNotLoaded: no driver here
        return None, f"NVML did not start ({type(exc).__name__})"
    try:
        return nvml_devices(nvml), "NVML"
    except Exception as exc:
        return None, f"NVML could not list the GPUs ({type(exc).__name__})"
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def _probe_smi(smi: str) -> tuple[list[Gpu] | None, str]:
    path = shutil.which(smi)
    if path is None:
        return None, f"{smi} is not on PATH"
    try:
        out = subprocess.run([path, "-L"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{smi} -L failed ({type(exc).__name__})"
    if out.returncode != 0:
        first = (out.stdout.strip() or out.stderr.strip()).splitlines()[:1]
        return None, f"{smi} -L exited {out.returncode}" + (f": {first[0][:120]}" if first else "")
    return parse_smi(out.stdout), f"{smi} -L"


def visible(devices: Sequence[Gpu], env: Mapping[str, str]) -> tuple[list[Gpu], list[str]]:
    """The devices ``CUDA_VISIBLE_DEVICES`` and ``NVIDIA_VISIBLE_DEVICES`` leave visible (both apply when both are
    set), by index (``2``), GPU UUID or a unique prefix of it (``GPU-8932f937``), MIG UUID, or ``GPU:MIG`` index
    (``0:1``); a GPU named by index or UUID brings its MIG devices. Returns them and notes on what was applied."""
    out = list(devices)
    notes: list[str] = []
    for var in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        if var not in env:
            continue
        raw = env[var].strip()
        if var == "NVIDIA_VISIBLE_DEVICES" and raw.lower() == "all":
            continue
        if raw.lower() in ("", "none", "void", "nodevfiles", "-1"):
            notes.append(f"{var}={raw!r} hides every GPU")
            out = []
            continue
        keep: list[Gpu] = []
        for token in (t.strip() for t in raw.split(",")):
            found = [d for d in out if _names(d, token) and d not in keep]
            if not found:
                shown = ", ".join(str(d.id) for d in devices) or "none"
                notes.append(f"{var} names {token!r}, which this host does not show (devices: {shown}; inside a "
                             "container GPUs are numbered from 0: name them by UUID)")
            keep += found
        out = [d for d in out if d in keep]  # in the host's order
        notes.append(f"{var}={raw}")
    return out, notes


def _names(d: Gpu, token: str) -> bool:
    if token.isdigit():
        return d.index == int(token)
    if re.fullmatch(r"\d+:\d+", token):
        g, m = token.split(":")
        return d.index == int(g) and d.mig == int(m)
    if token.startswith("MIG-"):
        return d.mig is not None and d.uuid.startswith(token)
    if token.startswith("GPU-"):
        return d.gpu_uuid.startswith(token)
    return False


def gpu_devices(*, nvml: Any = None, env: Mapping[str, str] | None = None,
                smi: str = "nvidia-smi") -> tuple[list[Gpu], str]:
    """This host's visible GPU devices and how they were found: NVML when it starts (``nvml``: a module like
    pynvml; None imports pynvml if installed), else ``nvidia-smi -L`` (``smi``: the command, looked up on PATH);
    then restricted by ``CUDA_VISIBLE_DEVICES`` / ``NVIDIA_VISIBLE_DEVICES`` of ``env`` (default: os.environ)."""
    env = os.environ if env is None else env
    found, how = _probe_nvml(nvml)
    if found is None:
        found, why_smi = _probe_smi(smi)
        how = why_smi if found is not None else f"no GPU found: {how}, and {why_smi}"
    shown, notes = visible(found or [], env)
    return shown, "; ".join([how, *notes])


def gpu_count(**kw: Any) -> int:
    """How many GPU devices ``gpu_devices`` finds (MIG devices counted one by one)."""
    return len(gpu_devices(**kw)[0])


# -- both --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Detected:
    """Slot totals of this host, the devices behind the device-bound types (``{"gpu": [0, 1]}``), and one note per
    type saying where its number came from."""

    totals: dict[str, int]
    devices: dict[str, list[DeviceId]] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)


def detect(overrides: Mapping[str, int] | None = None, *, probe: bool = True, nvml: Any = None,
           env: Mapping[str, str] | None = None, smi: str = "nvidia-smi", cgroup_root: str | Path = CGROUP_ROOT,
           self_cgroup: str | Path = SELF_CGROUP) -> Detected:
    """Detected cpu and gpu (``probe``), then ``overrides`` (which win, and may add types such as ``licence``).
    ``gpu`` set by hand to N means devices ``0 .. N-1``."""
    over = {k.lower(): int(v) for k, v in (overrides or {}).items()}
    totals: dict[str, int] = {}
    devices: dict[str, list[DeviceId]] = {}
    notes: dict[str, str] = {}
    if probe and "cpu" not in over:
        totals["cpu"], notes["cpu"] = _cpu(cgroup_root, self_cgroup)
    if probe and "gpu" not in over:
        gpus, how = gpu_devices(nvml=nvml, env=env, smi=smi)
        totals["gpu"], devices["gpu"] = len(gpus), [g.id for g in gpus]
        notes["gpu"] = f"gpu {len(gpus)} ({how})" + (f": {', '.join(str(g.id) for g in gpus)}" if gpus else "")
    for typ, n in over.items():
        totals[typ] = n
        notes[typ] = f"{typ} {n} (set by hand)"
    if "gpu" in over:
        devices["gpu"] = list(range(max(0, over["gpu"])))
    return Detected(totals, devices, notes)


def detect_totals(overrides: Mapping[str, int] | None = None) -> dict[str, int]:
    """``{"cpu": n, "gpu": m}`` detected, then ``overrides`` (which may add types such as ``licence``)."""
    return detect(overrides).totals
