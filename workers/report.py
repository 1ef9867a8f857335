"""A run's report: one self-contained HTML page with its plots, from its run directory
(metrics.jsonl, status.json, config.json), for a person to look at rather than read."""

from __future__ import annotations

import base64
import html
import io
import json
from collections import Counter
from pathlib import Path

from rollart.contracts import IterationMetrics
from rollart.workers.progress import read_metrics


def write_report(run_dir: Path) -> Path:
    """Writes run_dir/report.html; returns its path. Raises FileNotFoundError for a directory
    with no iterations yet."""
    metrics = read_metrics(run_dir)
    if not metrics:
        raise FileNotFoundError(f"{run_dir} has no metrics.jsonl with iterations to report")
    status = _json(run_dir / "status.json")
    config = _json(run_dir / "config.json")
    figures = [("Reward and success per domain", _learning(metrics)),
               ("Where each iteration's time went", _step_time(metrics)),
               ("Version lag of trained trajectories", _lag(metrics)),
               ("Env step latency (trajectory means)", _env_latency(metrics)),
               ("Replica load", _replicas(metrics)),
               ("Reward latency", _rewards(metrics))]
    out = run_dir / "report.html"
    out.write_text(_page(run_dir, metrics, status, config,
                         [(title, png) for title, png in figures if png]))
    return out


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _plot(draw) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    drawn = draw(ax)
    if drawn is False:
        plt.close(fig)
        return ""
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode()


def _learning(metrics: list[IterationMetrics]) -> str:
    def draw(ax) -> None:
        iterations = [m.iteration for m in metrics]
        ax.plot(iterations, [m.success_rate for m in metrics], marker="o", label="success")
        ax.plot(iterations, [m.reward_mean for m in metrics], linestyle="--", label="reward")
        domains = sorted({name for m in metrics for name in m.domains})
        for name in domains if len(domains) > 1 else []:
            ax.plot(iterations, [m.domains[name].success_rate if name in m.domains else None
                                 for m in metrics], linestyle=":", label=f"success: {name}")
        ax.set_xlabel("iteration")
        ax.set_ylim(-0.02, 1.02)
    return _plot(draw)


def _step_time(metrics: list[IterationMetrics]) -> str:
    def draw(ax) -> None:
        iterations = [m.iteration for m in metrics]
        bottom = [0.0] * len(metrics)
        for label, values in (("rollout (trainer waits)", [m.rollout_s for m in metrics]),
                              ("train", [m.train_s for m in metrics]),
                              ("weight update", [m.weight_update_s for m in metrics])):
            ax.bar(iterations, values, bottom=bottom, label=label)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.set_xlabel("iteration")
        ax.set_ylabel("seconds")
    return _plot(draw)


def _lag(metrics: list[IterationMetrics]) -> str:
    lags: Counter = Counter()
    for m in metrics:
        lags.update({int(lag): count for lag, count in m.lag_histogram.items()})

    def draw(ax) -> None:
        ax.bar(sorted(lags), [lags[k] for k in sorted(lags)])
        ax.set_xticks(sorted(lags))
        ax.set_xlabel("versions behind the trained policy")
        ax.set_ylabel("trajectories")
    return _plot(draw) if lags else ""


def _env_latency(metrics: list[IterationMetrics]) -> str:
    domains = sorted({name for m in metrics for name, d in m.domains.items()
                      if d.env_step_s_p99 > 0})
    return _p50_p99(metrics, domains, "seconds per step", lambda m, name: (
        (m.domains[name].env_step_s_p50, m.domains[name].env_step_s_p99)
        if name in m.domains else None))


def _p50_p99(metrics: list[IterationMetrics], names: list[str], ylabel: str, pick) -> str:
    """p50 (solid) and p99 (dashed) per name over the iterations; pick(m, name) gives the two,
    or None where the iteration has none."""
    def draw(ax) -> None:
        for name in names:
            shown = [(m.iteration, pick(m, name)) for m in metrics if pick(m, name)]
            ax.plot([i for i, _ in shown], [q[0] for _, q in shown], marker=".",
                    label=f"{name} p50")
            ax.plot([i for i, _ in shown], [q[1] for _, q in shown], linestyle="--",
                    label=f"{name} p99")
        ax.set_xlabel("iteration")
        ax.set_ylabel(ylabel)
    return _plot(draw) if names else ""


def _replicas(metrics: list[IterationMetrics]) -> str:
    names = sorted({name for m in metrics for name in m.replicas})

    def draw(ax) -> None:
        for name in names:
            ax.plot([m.iteration for m in metrics],
                    [m.replicas[name].in_flight_mean if name in m.replicas else None
                     for m in metrics], marker=".", label=name.removeprefix("rollart.gen."))
        ax.set_xlabel("iteration")
        ax.set_ylabel("requests in flight (mean)")
    return _plot(draw) if names else ""


def _rewards(metrics: list[IterationMetrics]) -> str:
    kinds = sorted({kind for m in metrics for kind in m.rewards})
    return _p50_p99(metrics, kinds, "seconds from trajectory end", lambda m, kind: (
        (m.rewards[kind].latency_s_p50, m.rewards[kind].latency_s_p99)
        if kind in m.rewards else None))


def _page(run_dir: Path, metrics: list[IterationMetrics], status: dict, config: dict,
          figures: list[tuple[str, str]]) -> str:
    ledger = status.get("ledger", {})
    algorithm = config.get("algorithm", {})
    facts = [("run directory", str(run_dir)), ("iterations", str(len(metrics))),
             ("mode", f"{status.get('mode', algorithm.get('mode', '?'))} "
                      f"(alpha {status.get('alpha', '?')})"),
             ("domains", ", ".join(config.get("domains") or metrics[-1].domains) or "?"),
             ("final success", f"{metrics[-1].success_rate:.2f}"),
             ("trajectories", ", ".join(f"{k} {v}" for k, v in ledger.items()) or "running"),
             ("wall time", f"{sum(m.step_s for m in metrics) / 60:.1f} min")]
    failures: Counter = Counter()
    for m in metrics:
        failures.update(m.failures)
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                   for k, v in facts)
    rows += "".join(f"<tr><th>failed: {html.escape(reason)}</th><td>{count}</td></tr>"
                    for reason, count in failures.most_common())
    sections = "".join(f'<h2>{html.escape(title)}</h2><img alt="{html.escape(title)}" '
                       f'src="data:image/png;base64,{png}">' for title, png in figures)
    return ("<!doctype html><html><head><meta charset='utf-8'><title>rollart run report</title>"
            "<style>body{font-family:sans-serif;max-width:760px;margin:24px auto;color:#222}"
            "th{text-align:left;padding-right:16px;font-weight:600}img{width:100%}"
            "h2{font-size:16px;margin-top:28px}</style></head><body>"
            f"<h1>rollart run report</h1><table>{rows}</table>{sections}</body></html>")
