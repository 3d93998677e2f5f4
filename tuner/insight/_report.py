"""The study report: one self-contained HTML file that opens offline.

plotly.js is inlined once (no CDN, no request at open), each figure is a plotly div. What it
shows: throughput against ``num_workers`` and the batch parameter, the history with the ceiling
line, Optuna's parameter importances, a per-step timeline of step time against data-wait time
for the baselines and the best (so the starvation the tuning removed is visible), and a table of
the baselines against the best.
"""

from __future__ import annotations

import html
import math
import warnings
from collections.abc import Sequence
from typing import Any

import optuna
import plotly.graph_objects as go
import plotly.offline
from optuna.artifacts import FileSystemArtifactStore
from optuna.trial import FrozenTrial, TrialState
from plotly.subplots import make_subplots

from storage import read_trial_text
from tuner._attrs import has_settings, remeasured, study_batch_param, trial_settings
from tuner._naming import BASELINE_PYTORCH_DEFAULT, BASELINE_RULE_OF_THUMB, CEILING_ATTR
from tuner.insight._best import BestSetting, study_best
from tuner.insight._diagnosis import diagnose_trial
from tuner.insight._pipeline import bound_of, model_error, profile_line, stored_profile
from tuner.insight._summary import efficiency, study_diagnosis, trial_throughput
from tuner.search import LoaderSettings
from tuner.trial import STEPS_CSV, TIMELINE_ATTR, read_timeline_csv

__all__ = ["build_report", "trial_timeline"]

_CONFIG = {"displaylogo": False, "responsive": True}

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.2rem; margin-top: 2.5rem; }
table { border-collapse: collapse; margin: 1rem 0; font-size: 0.9rem; }
th, td { border: 1px solid #ccc; padding: 0.3rem 0.6rem; text-align: right; }
th { background: #f3f3f3; } td.text { text-align: left; }
p.missing { color: #777; font-style: italic; }
"""


def trial_timeline(
    study: optuna.Study, trial: FrozenTrial, store: FileSystemArtifactStore | None
) -> list[list[float]] | None:
    """A trial's ``[t_s, steps, data_wait_s, step_s]`` rows: its ``steps.csv``, else its attr."""
    if store is not None:
        text = read_trial_text(store, study, trial, STEPS_CSV)
        if text:
            return read_timeline_csv(text)
    rows = trial.user_attrs.get(TIMELINE_ATTR)
    return [list(row) for row in rows] if rows else None


def _settings(trial: FrozenTrial) -> LoaderSettings:
    return trial_settings(trial)


def _hover(trial: FrozenTrial, batch_param: str) -> str:
    s = _settings(trial)
    label = trial.user_attrs.get("baseline", "")
    return (
        f"trial {trial.number} {label}<br>num_workers={s.num_workers} {batch_param}={s.batch}"
        f"<br>prefetch_factor={s.prefetch_factor} pin_memory={s.pin_memory}"
        f"<br>persistent_workers={s.persistent_workers} threads={s.torch_num_threads}"
    )


def _throughput_figure(complete: Sequence[FrozenTrial], batch_param: str) -> go.Figure:
    figure = make_subplots(
        rows=1, cols=2, shared_yaxes=True, subplot_titles=("num_workers", batch_param)
    )
    values = [t.value or 0.0 for t in complete]
    hover = [_hover(t, batch_param) for t in complete]
    batches = [_settings(t).batch for t in complete]
    workers = [_settings(t).num_workers for t in complete]
    figure.add_trace(
        go.Scatter(
            x=workers,
            y=values,
            mode="markers",
            text=hover,
            hoverinfo="text+y",
            name=f"by num_workers (colour: log2 {batch_param})",
            marker={
                "color": [math.log2(b) for b in batches],
                "colorscale": "Viridis",
                "size": 9,
            },
        ),
        row=1,
        col=1,
    )
    figure.add_trace(
        go.Scatter(
            x=batches,
            y=values,
            mode="markers",
            text=hover,
            hoverinfo="text+y",
            name="by batch (colour: num_workers)",
            marker={"color": workers, "colorscale": "Plasma", "size": 9},
        ),
        row=1,
        col=2,
    )
    ticks = sorted(set(batches))
    figure.update_xaxes(type="log", tickvals=ticks, ticktext=[str(b) for b in ticks], row=1, col=2)
    figure.update_yaxes(title_text="samples/s", row=1, col=1)
    figure.update_layout(height=420, showlegend=False, margin={"t": 40})
    return figure


def _history_figure(
    trials: Sequence[FrozenTrial], ceiling: float | None, batch_param: str
) -> go.Figure:
    complete = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
    figure = go.Figure()
    figure.add_trace(
        go.Scatter(
            x=[t.number for t in complete],
            y=[t.value for t in complete],
            mode="markers",
            name="trial",
            text=[_hover(t, batch_param) for t in complete],
            hoverinfo="text+y",
        )
    )
    best_so_far, running = [], 0.0
    for trial in complete:
        running = max(running, trial.value or 0.0)
        best_so_far.append(running)
    figure.add_trace(
        go.Scatter(
            x=[t.number for t in complete],
            y=best_so_far,
            mode="lines",
            name="best so far",
            line={"shape": "hv"},
        )
    )
    if ceiling:
        figure.add_hline(
            y=ceiling,
            line_dash="dash",
            line_color="firebrick",
            annotation_text=f"ceiling {ceiling:,.0f} samples/s",
            annotation_position="top left",
        )
    figure.update_layout(height=400, xaxis_title="trial", yaxis_title="samples/s", margin={"t": 30})
    return figure


def _importance_figure(study: optuna.Study) -> go.Figure | None:
    try:
        with warnings.catch_warnings():
            # "some regimes have less than 2 trials": expected in a short study; shown anyway.
            warnings.simplefilter("ignore", UserWarning)
            importances = optuna.importance.get_param_importances(study)
    except (ValueError, RuntimeError, ZeroDivisionError):  # too few or too uniform trials
        return None
    if not importances:
        return None
    names = list(importances)[::-1]
    figure = go.Figure(
        go.Bar(x=[importances[n] for n in names], y=names, orientation="h", name="importance")
    )
    figure.update_layout(
        height=80 + 40 * len(names), xaxis_title="importance (PED-ANOVA)", margin={"t": 20}
    )
    return figure


def _timeline_figure(timelines: Sequence[tuple[str, list[list[float]]]]) -> go.Figure:
    figure = make_subplots(
        rows=1,
        cols=len(timelines),
        shared_yaxes=True,
        subplot_titles=[name for name, _ in timelines],
    )
    for column, (_, rows) in enumerate(timelines, start=1):
        times = [row[0] for row in rows]
        for index, name, colour in ((3, "step", "#4c78a8"), (2, "data wait", "#e45756")):
            figure.add_trace(
                go.Scatter(
                    x=times,
                    y=[1000.0 * row[index] / row[1] for row in rows],
                    mode="lines",
                    stackgroup=f"steps{column}",
                    name=name,
                    line={"color": colour, "width": 0.5},
                    legendgroup=name,
                    showlegend=column == 1,
                ),
                row=1,
                col=column,
            )
        figure.update_xaxes(title_text="time in the window (s)", row=1, col=column)
    figure.update_yaxes(title_text="ms per step", row=1, col=1)
    figure.update_layout(height=380, margin={"t": 40})
    return figure


def _cell(value: Any, text: bool = False) -> str:
    css = ' class="text"' if text else ""
    return f"<td{css}>{html.escape(str(value))}</td>"


_COMPARISON_HEADERS = (
    "",
    "trial",
    "samples/s",
    "re-measured",
    "efficiency",
    "predicted",
    "of bound",
    "speedup of best",
    "data wait",
    "num_workers",
    None,  # the batch parameter's name
    "prefetch",
    "pin_memory",
    "persistent",
    "threads",
    "bottleneck",
)


def _comparison_row(
    label: str,
    trial: FrozenTrial,
    medians: dict[int, float],
    best_throughput: float,
    ceiling: float | None,
) -> str:
    """One ``<tr>`` of the comparison table, in the order of :data:`_COMPARISON_HEADERS`."""
    s = _settings(trial)
    throughput = trial_throughput(trial, medians)
    share = efficiency(throughput, ceiling)
    wait = trial.user_attrs.get("data_wait_fraction")
    diagnosis = diagnose_trial(trial)
    again = medians.get(trial.number)
    cells = [
        _cell(label, text=True),
        _cell(trial.number),
        _cell(f"{trial.value:,.1f}" if trial.value is not None else "-"),
        _cell(f"{again:,.1f}" if again is not None else "-"),
        _cell(f"{share:.0%}" if share is not None else "-"),
        _cell(_number(trial.user_attrs.get("predicted_samples_per_sec"), ",.0f")),
        _cell(_number(trial.user_attrs.get("bound_efficiency"), ".0%")),
        _cell(f"{best_throughput / throughput:.2f}x" if throughput else "-"),
        _cell(f"{float(wait):.0%}" if wait is not None else "-"),
        _cell(s.num_workers),
        _cell(s.batch),
        _cell(s.prefetch_factor if s.prefetch_factor is not None else "-"),
        _cell(s.pin_memory),
        _cell(s.persistent_workers),
        _cell(s.torch_num_threads),
        _cell(diagnosis.bottleneck if diagnosis is not None else "-", text=True),
    ]
    return "<tr>" + "".join(cells) + "</tr>"


def _comparison_table(
    study: optuna.Study,
    rows: Sequence[tuple[str, FrozenTrial]],
    best: FrozenTrial,
    ceiling: float | None,
    batch_param: str,
) -> str:
    medians = remeasured(study)
    best_throughput = trial_throughput(best, medians)
    headers = [batch_param if h is None else h for h in _COMPARISON_HEADERS]
    lines = ["<table>", "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in headers) + "</tr>"]
    lines += [
        _comparison_row(label, trial, medians, best_throughput, ceiling) for label, trial in rows
    ]
    lines.append("</table>")
    if diagnosis := study_diagnosis(study, best):
        lines.append(
            f"<p>Best: <b>{html.escape(diagnosis.bottleneck)}</b>: "
            f"{html.escape(diagnosis.advice)}.</p>"
        )
    return "\n".join(lines)


def _number(value: Any, spec: str) -> str:
    return "-" if value is None else format(float(value), spec)


def _pipeline_paragraph(study: optuna.Study, trials: Sequence[FrozenTrial]) -> str:
    profile = stored_profile(study.user_attrs)
    if profile is None:
        return ""
    text = f"Pipeline: {profile_line(profile)}."
    error = model_error(trials)
    if error is not None:
        text += f" The model's median error: {error[0]:.0%} over {error[1]} measured trials."
    return f"<p>{html.escape(text)}</p>"


def _section(title: str, figure: go.Figure | None, div_id: str, missing: str) -> str:
    body = (
        figure.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=_CONFIG)
        if figure is not None
        else f'<p class="missing">{html.escape(missing)}</p>'
    )
    return f"<h2>{html.escape(title)}</h2>\n{body}"


def _compared(complete: Sequence[FrozenTrial], best: FrozenTrial) -> list[tuple[str, FrozenTrial]]:
    """The baselines (first of each name) and the best, in the order the report shows them."""
    baselines: dict[str, FrozenTrial] = {}
    for trial in complete:
        name = trial.user_attrs.get("baseline")
        if name in (BASELINE_PYTORCH_DEFAULT, BASELINE_RULE_OF_THUMB) and name not in baselines:
            baselines[name] = trial
    return [*sorted(baselines.items()), ("best", best)]


def _headline(study: optuna.Study, chosen: BestSetting, ceiling: float | None) -> str:
    """The trial counts by state, then the best with its share of the ceiling and the bound."""
    trials = study.get_trials(deepcopy=False)
    counts = {state.name.lower(): sum(t.state == state for t in trials) for state in TrialState}
    summary = ", ".join(f"{n} {state}" for state, n in counts.items() if n)
    headline = f"best: trial {chosen.trial_number}, {chosen.figure.text()}"
    if ceiling:
        headline += (
            f", {efficiency(chosen.samples_per_sec, ceiling):.0%} of the ceiling "
            f"({ceiling:,.1f} samples/s)"
        )
    bound = bound_of(study.user_attrs)
    if bound:
        headline += f", {chosen.samples_per_sec / bound:.0%} of the bound ({bound:,.1f} samples/s)"
    return f"{summary}; {headline}."


def build_report(study: optuna.Study, store: FileSystemArtifactStore | None = None) -> str:
    """The whole report as one HTML document; the caller has checked a trial completed."""
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE and has_settings(t)]
    chosen = study_best(study)
    if chosen is None or chosen.trial is None or not complete:
        raise ValueError(f"study {study.study_name} has no completed trial")
    best = chosen.trial
    batch_param = study_batch_param(study)
    ceiling = study.user_attrs.get(CEILING_ATTR)
    ceiling = float(ceiling) if ceiling else None
    compared = _compared(complete, best)
    timelines = [
        (f"{label} (trial {trial.number})", rows)
        for label, trial in compared
        if (rows := trial_timeline(study, trial, store))
    ]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(study.study_name)}: DataLoader tuning report</title>",
        f"<style>{_STYLE}</style>",
        f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>',
        "</head><body>",
        f"<h1>{html.escape(study.study_name)}</h1>",
        f"<p>{html.escape(_headline(study, chosen, ceiling))}</p>",
        "<h2>Baselines against the best</h2>",
        _comparison_table(study, compared, best, ceiling, batch_param),
        _pipeline_paragraph(study, trials),
        _section(
            "Throughput against num_workers and batch size",
            _throughput_figure(complete, batch_param),
            "throughput",
            "",
        ),
        _section("History", _history_figure(trials, ceiling, batch_param), "history", ""),
        _section(
            "Parameter importances",
            _importance_figure(study),
            "importances",
            "Not enough completed trials with varied parameters for importances yet.",
        ),
        _section(
            "Per-step timeline: step time against data wait",
            _timeline_figure(timelines) if timelines else None,
            "timeline",
            "No per-step timeline recorded for the baselines or the best "
            f"(the trials' {STEPS_CSV} artifacts).",
        ),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"
