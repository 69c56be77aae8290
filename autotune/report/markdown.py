"""The study report as Markdown a person can paste into a ticket: the winner, its gain over the
engine defaults, the flags that changed, and the failures by outcome. The plots stay in the HTML
page; a ticket gets its numbers, not pictures."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from autotune.report.simband import report_sentence
from autotune.report.summary import SPREAD_NOTE, Gain, StudyReport, TrialNote, format_number

__all__ = ["render_markdown"]

REASON_CHARS = 160


def _cell(text: object) -> str:
    """One table cell: a pipe or newline inside would break the row."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(headers: Sequence[str], rows: Iterable[Sequence[object]], align: str) -> list[str]:
    """A GitHub table; ``align`` holds one letter per column (l or r)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def _intro(report: StudyReport) -> list[str]:
    lines = [f"# autotune report: {report.name}", ""]
    if report.simulated:
        lines += [f"> **Simulated engine: numbers are modelled**, not measured on hardware. {report_sentence()}", ""]
    lines += [
        f"{report.engine} · model `{report.model}` · workload {report.workload} · "
        f"{report.direction} `{report.objective}` · {report.trials_text} · {report.generated}",
        "",
    ]
    return lines


def _winner(report: StudyReport) -> list[str]:
    stopped = [f"**Stopped early:** {report.stopped_line}.", ""] if report.stopped_line else []
    ended = [f"**Search ended early:** {report.search_stall}.", ""] if report.search_stall else []
    if report.winner is None:
        text = report.no_winner_text
        return ["## Winner", "", *stopped, *ended, f"{text[0].upper()}{text[1:]}; see the failures below.", ""]
    gain = report.objective_gain
    if report.verdict_line:  # measured side by side with the defaults: the gain the study stands by
        change = f"; side by side with the defaults: **{report.verdict_line}**"
    elif gain is not None and gain.change is not None:
        change = f", {gain.change:+.1%} against the engine defaults' one run (not measured side by side)"
    else:
        change = " (no served baseline to compare with)"
    headline = f"`{report.objective}` **{format_number(report.winner_value)}** ({report.winner_runs_text}){change}."
    noise = [f"Decisions allowed for the {report.noise_line}.", ""]
    noise += [f"{report.twin_line[0].upper()}{report.twin_line[1:]}.", ""] if report.twin_line else []
    return [f"## Winner: trial #{report.winner.number}", "", headline, "", *ended, *noise]


def _change(gain: Gain) -> str:
    if gain.change is None:
        return "–"
    mark = {True: " ✓", False: " ✗", None: ""}[gain.improved]
    return f"{gain.change:+.1%}{mark}"


def _gains(report: StudyReport) -> list[str]:
    if not report.gains:
        return []
    rows = [
        (
            f"{g.label} ({g.unit})" if g.unit else g.label,
            format_number(g.baseline),
            format_number(g.winner),
            "–" if g.spread is None else f"{g.spread:.1%}",
            _change(g),
        )
        for g in report.gains
    ]
    table = _table(["metric", "engine defaults", "winner", "spread", "change"], rows, "lrrrr")
    return ["### Gain over the engine defaults", "", *table, "", SPREAD_NOTE, ""]


def _flags(report: StudyReport) -> list[str]:
    if not report.flags:
        return []
    rows = [(f"`{r.flag}`", r.baseline, f"**{r.winner}**" if r.changed else r.winner) for r in report.flags]
    table = _table(["flag", "engine defaults", "winner"], rows, "lll")
    return ["### Flags", "", *table, "", f"Launch script: `autotune export {report.name}`.", ""]


def _failures(report: StudyReport) -> list[str]:
    if not report.failures:
        return ["## Failures", "", "None: every trial served the workload within its SLOs.", ""]
    by_outcome: dict[str, list[TrialNote]] = defaultdict(list)
    for f in report.failures:
        by_outcome[f.outcome].append(f)
    rows = []
    for outcome, notes in sorted(by_outcome.items(), key=lambda kv: -len(kv[1])):
        example = next((n for n in notes if n.reason), notes[0])
        reason = example.reason[:REASON_CHARS].replace("`", "'")  # a backtick would end the code span
        rows.append(
            (
                outcome,
                len(notes),
                ", ".join(str(n.trial) for n in notes),
                f"`{reason}` (trial {example.trial})" if reason else "",
            )
        )
    table = _table(["outcome", "count", "trials", "example"], rows, "lrll")
    return ["## Failures by outcome", "", *table, ""]


def render_markdown(report: StudyReport) -> str:
    """The Markdown summary (the plots are in ``report.html`` beside it)."""
    lines = _intro(report) + _winner(report) + _gains(report) + _flags(report) + _failures(report)
    lines += ["Plots, every trial's engine facts and links to the logs: `report.html`."]
    return "\n".join(lines) + "\n"
