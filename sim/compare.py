"""`sim5d compare`: scenarios side by side, with what they cost.

Per scenario: the `run` summary (step time, MFU, memory, the compute / exposed communication /
bubble split, here also in seconds) and the cost of training on it at a price per GPU-hour
(the device profile's `price_per_gpu_hour_usd`, or `--price`):

    GPU-hours per step        = num_gpus x step_time_s / 3600
    $ per step                = GPU-hours per step x price
    $ per billion tokens      = $ per step / tokens per step x 1e9
    days to train N tokens    = N / tokens_per_s / 86400
    GPU-hours to train N      = N / tokens_per_s x num_gpus / 3600
    $ to train N tokens       = GPU-hours to train N x price

(tokens per step = global_batch_size x seq_length). A profile's price of 0 (unknown) leaves the $ figures
empty (null in JSON) rather than zero.
"""

from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path

from sim.devices import MAX_PRICE_PER_GPU_HOUR_USD
from sim.errors import ConfigError

_TOKENS_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMBT]?)\s*$", re.IGNORECASE)
_TOKEN_UNITS = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}
DEFAULT_TOKENS = "1T"


def scaled_number(text: str, units: str = "KMBT") -> float | None:
    """'15T', '$2.5M', '2.5e12' -> the number (K, M, B, T: powers of 1000, those in `units`; a
    leading '$' is allowed); None if `text` is not of that form."""
    m = _TOKENS_RE.match(str(text).strip().removeprefix("$"))
    if not m or (m.group(2) and m.group(2).upper() not in units):
        return None
    return float(m.group(1)) * _TOKEN_UNITS[m.group(2).upper()]


def parse_tokens(text: str) -> float:
    """'15T', '300B', '2.5e12' -> tokens (K, M, B, T are powers of 1000)."""
    n = scaled_number(text) if not str(text).strip().startswith("$") else None
    if n is None:
        raise ConfigError(f"--tokens {text!r} is not a token count; use a number with an optional K, M, B "
                          "or T suffix, e.g. 15T or 300B", key="--tokens")
    if not 0 < n < 1e18:
        raise ConfigError(f"--tokens {text!r} must be positive and below 1e18 (a quintillion)",
                          key="--tokens")
    if n < 1 or n != int(n):            # (0.5 and 1.5 had been taken: a time for half a token)
        raise ConfigError(f"--tokens {text!r} is not a whole number of tokens", key="--tokens")
    return n


def format_tokens(n: float) -> str:
    """15e12 -> '15T' (the largest of T, B, M, K that keeps a number >= 1)."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.4g}{unit}"
    return f"{n:.4g}"


def parse_prices(items: list[str]) -> tuple[float | None, dict]:
    """`--price X` (every scenario) and `--price NAME=X` (a scenario or device-profile name)."""
    default, named = None, {}
    for item in items:
        name, sep, value = item.rpartition("=")
        try:
            price = float(value)
        except ValueError:
            raise ConfigError(f"--price {item!r}: the price must be a number of US dollars per GPU-hour, "
                              "as X or NAME=X (NAME: a scenario or device-profile name)", key="--price") from None
        if not math.isfinite(price) or price <= 0:       # (0, a profile's "unknown", had dropped every $ figure)
            raise ConfigError(f"--price {item!r}: the price must be a finite number above 0 (a device profile's 0 "
                              "means unknown; leave --price out for the profile's price)", key="--price")
        if price > MAX_PRICE_PER_GPU_HOUR_USD:      # (1e308 had made the $ figures inf: not JSON)
            raise ConfigError(f"--price {item!r}: at most {MAX_PRICE_PER_GPU_HOUR_USD:,.0f} US$ per GPU-hour, "
                              "as a device profile's price", key="--price")
        if (name.strip() in named) if sep else (default is not None):    # (the last had won, without a word)
            raise ConfigError(f"--price {item!r}: {'a price for ' + name.strip() if sep else 'a price for every row'} "
                              "is given twice; keep one", key="--price")
        if sep:
            named[name.strip()] = price
        else:
            default = price
    return default, named


def check_prices_used(default: float | None, named: dict, priced: list[tuple[str, str]]) -> None:
    """Every --price (`parse_prices`' bare price and named ones) prices something: `priced` holds
    each row's (name, device profile), and a row takes its name's price, else its profile's, else
    the bare one. One that no row would take (a profile whose every row has its own price, a bare
    price under named ones) is refused, not left unused without a word."""
    used = set()
    for name, gpu in priced:
        used.add(name if name in named else gpu if gpu in named else None)
    for name in named:
        if name not in used:
            raise ConfigError(f"--price {name}=...: prices nothing here: every row of {name} has a price of its own "
                              "(a name's price is taken over its device profile's); drop one", key="--price")
    if default is not None and None not in used:
        raise ConfigError(f"--price {default:g}: prices nothing here: every row has a named price; drop one",
                          key="--price")


def cost_figures(summary: dict, tokens_per_step: float, price: float | None, tokens: float) -> dict:
    """The cost block of one scenario (see the module docstring)."""
    gpus, step = summary["num_gpus"], summary["step_time_s"]
    gpu_hours_step = gpus * step / 3600.0
    train_s = tokens / summary["tokens_per_s"]
    out = {"price_per_gpu_hour_usd": price, "gpu_hours_per_step": gpu_hours_step,
           "days_to_train": train_s / 86400.0, "gpu_hours_to_train": train_s * gpus / 3600.0,
           "usd_per_step": None, "usd_per_billion_tokens": None, "usd_to_train": None}
    if price:
        usd_step = gpu_hours_step * price
        out.update(usd_per_step=usd_step, usd_per_billion_tokens=usd_step / tokens_per_step * 1e9,
                   usd_to_train=out["gpu_hours_to_train"] * price)
    return out


def layout_text(sc) -> str:
    """A scenario's layout in one line: 'tp2 pp2 vpp1 cp1 ep1 dp4 1f1b ZeRO-1 mbs1 recompute none'."""
    p = sc.parallelism
    return (f"tp{p.tp} pp{p.pp} vpp{p.vpp} cp{p.cp} ep{p.ep}{f' etp{p.etp}' if p.etp != p.tp else ''} "
            f"dp{p.dp} {p.pipeline_schedule} ZeRO-{p.zero_stage} mbs{sc.training.micro_batch_size} "
            f"recompute {sc.training.recompute_text}")


def precision_text(t) -> str:
    """A scenario's precision in a few words, with the stored types that are not the precision's
    defaults: 'bf16', 'fp8 current scaling', 'bf16 (grads fp32, Adam m, v bf16)'."""
    head = f"fp8 {t.fp8_recipe} scaling" if t.precision == "fp8" else t.precision
    extra = []
    if t.grad_reduce_in_fp32 and t.precision != "fp32":
        extra.append("grads fp32")
    if t.store_param_remainders:
        extra.append("master as remainders")
    elif t.main_params_dtype != "fp32":
        extra.append(f"master {t.main_params_dtype}")
    m, v = t.exp_avg_dtype, t.exp_avg_sq_dtype
    if (m, v) != ("fp32", "fp32"):
        extra.append(f"Adam m, v {m}" if m == v else f"Adam m {m}, v {v}")
    return head + (f" ({', '.join(extra)})" if extra else "")


def evaluate(path: str, overrides: list[str]) -> dict:
    """Load and simulate one scenario; the row of the comparison (without costs)."""
    from sim.config import load_scenario
    from sim.engine.simulate import simulate

    sc = load_scenario(path, overrides)
    s = simulate(sc).summary()
    row = {"name": sc.name, "file": str(path), "model": sc.model.name, "topology": sc.cluster.topology.name,
           "gpu": sc.cluster.gpu.name, "network": sc.simulation.network, "layout": layout_text(sc),
           "precision": precision_text(sc.training),
           "tokens_per_step": sc.tokens_per_step, "profile_price_per_gpu_hour_usd": sc.cluster.gpu.price_per_gpu_hour_usd}
    row.update({k: v for k, v in s.items() if k != "name"})
    for part in ("compute", "exposed_comm", "bubble"):
        row[f"{part}_s"] = s[f"{part}_fraction"] * s["step_time_s"]
    return row


def compare(paths: list[str], overrides: list[str], *, tokens: float, price_items: list[str],
            workers: int | None = None) -> list[dict]:
    """Every scenario validated first (errors name file and line), then simulated (in parallel
    when there are cores to spare), then priced. Rows keep the order of `paths`."""
    from sim.config import load_scenario

    if not paths:
        raise ConfigError("give at least one scenario file to compare", key="SCENARIOS")
    default_price, named = parse_prices(price_items)
    scenarios = [load_scenario(p, overrides) for p in paths]
    known = {sc.name for sc in scenarios} | {sc.cluster.gpu.name for sc in scenarios}
    for name in named:
        if name not in known:
            raise ConfigError(f"--price {name}=...: {name!r} is neither a scenario nor a device profile of this "
                              f"comparison ({', '.join(sorted(known))})", key="--price")
    check_prices_used(default_price, named, [(sc.name, sc.cluster.gpu.name) for sc in scenarios])
    from sim.sweep.executors import available_cores

    n = min(len(paths), workers or available_cores())
    if n > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
        with ProcessPoolExecutor(max_workers=n, mp_context=ctx) as pool:
            rows = list(pool.map(evaluate, paths, [overrides] * len(paths)))
    else:
        rows = [evaluate(p, overrides) for p in paths]
    for row in rows:
        if row["name"] in named:
            price, src = named[row["name"]], "--price"
        elif row["gpu"] in named:
            price, src = named[row["gpu"]], "--price"
        elif default_price is not None:
            price, src = default_price, "--price"
        else:
            price, src = row["profile_price_per_gpu_hour_usd"] or None, "profile"
        row.update(cost_figures(row, row["tokens_per_step"], price, tokens))
        row["price_source"] = src if price else "unknown"
    return rows


# ----------------------------------------------------------------------------------------------
def money_unit(values: list) -> tuple[str, float]:
    """The unit ($, $K or $M) of a chart of these dollar sums (None: no price) and the dollars
    it stands for: $M from a million up, $K from a thousand."""
    top = max((v for v in values if v is not None), default=0.0)
    return ("$M", 1e6) if top >= 1e6 else ("$K", 1e3) if top >= 1e3 else ("$", 1.0)


def plot(rows: list[dict], tokens: float, path: Path) -> Path:
    """Side-by-side bars, each with its value: step time split into compute / exposed comm /
    bubble, MFU, peak memory against capacity, $ per billion tokens, days and $ to train `tokens`.
    Text is drawn as is: a `$` never starts matplotlib's math mode."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    names = [r["name"] for r in rows]
    x = range(len(rows))
    colours = colormaps["tab10"].colors
    fig = Figure(figsize=(max(12, 2.2 * len(rows) * 3 / 2), 7.5), layout="constrained")
    axes = fig.subplots(2, 3)
    ax = axes[0][0]
    bottom = [0.0] * len(rows)
    for part, colour in (("compute", "#2ca02c"), ("exposed_comm", "#d62728"), ("bubble", "#bbbbbb")):
        vals = [r[f"{part}_s"] for r in rows]
        ax.bar(x, vals, bottom=bottom, color=colour, label=part.replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, total in enumerate(bottom):
        ax.text(i, total, f"{total:.3g}", ha="center", va="bottom", fontsize=8)
    ax.set_title("step time (s)")
    # below the charts: inside the axes it covered the first bar (the bars fill it)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=3, fontsize=8,
               title="step time", title_fontsize=8, frameon=False)

    def bars(ax, key, title, fmt, scale=1.0, missing="no price"):
        vals = [(r[key] * scale if r.get(key) is not None else None) for r in rows]
        for i, v in enumerate(vals):
            if v is None:
                ax.text(i, 0, missing, ha="center", va="bottom", fontsize=8, rotation=90)
                continue
            ax.bar(i, v, color=colours[i % len(colours)])
            ax.text(i, v, fmt.format(v), ha="center", va="bottom", fontsize=8)
        ax.set_title(title, parse_math=False)

    bars(axes[0][1], "mfu", "MFU (%)", "{:.1f}", 100.0)
    ax = axes[0][2]
    bars(ax, "peak_memory_gib", "peak memory per GPU (GiB)", "{:.1f}")
    for i, r in enumerate(rows):
        ax.plot([i - 0.4, i + 0.4], [r["memory_capacity_gib"]] * 2, color="red", lw=1.5,
                label="capacity" if i == 0 else None)
    ax.legend(fontsize=7, loc="best")
    bars(axes[1][0], "usd_per_billion_tokens", "$ per billion tokens", "{:,.0f}")
    bars(axes[1][1], "days_to_train", f"days to train {format_tokens(tokens)} tokens", "{:.1f}", missing="")
    unit, dollars = money_unit([r.get("usd_to_train") for r in rows])      # (a small model's $140K had read "0.14" $M)
    bars(axes[1][2], "usd_to_train", f"{unit} to train {format_tokens(tokens)} tokens", "{:,.3g}", 1 / dollars)
    ticks = ["\n".join(textwrap.wrap(n, 16, break_on_hyphens=True)) for n in names]
    for row_axes in axes:
        for a in row_axes:
            a.set_xticks(list(x), ticks, fontsize=7)
            a.grid(axis="y", alpha=0.3)
    fig.suptitle("; ".join(f"{r['name']}: {r['num_gpus']} x {r['gpu']} @ "
                           f"{'$%.2f/GPU-h' % r['price_per_gpu_hour_usd'] if r['price_per_gpu_hour_usd'] else 'no price'}"
                           for r in rows), fontsize=8, parse_math=False)
    for a in axes.flat:
        a.margins(y=0.12)                                     # room for the value labels
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path
