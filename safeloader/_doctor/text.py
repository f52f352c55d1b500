"""The report of ``safeloader doctor`` as text, from what ``collect`` found
(why: docs/internals.md, ``safeloader._doctor``)."""

from __future__ import annotations

from typing import Any

__all__ = ["format_report"]

_SECTIONS = (
    ("handled", "Handled at fork (the hook that handles each):", "ok  ", "handled by"),
    ("harmless", "Live, but safe at fork by itself:", "ok  ", "why"),
    ("breaks", "Will break in forked workers:", "WARN", "remedy"),
    ("unknown", "Not known to safeloader (may or may not break):", "??  ", "if it does"),
)


def format_report(report: dict[str, Any]) -> str:
    """The human-readable report."""
    lines = ["safeloader doctor", "", "Versions:"]
    for name, version in report["versions"].items():
        lines.append(f"  {name:<18} {version or 'not installed'}")
    start = report["start_method"]
    lines += [
        "",
        f"Start method: workers will be started with {start['safeloader']!r} ({start['why']}; "
        f"torch's default here: {start['torch_default']!r}).",
    ]
    if not start["hooks_run"]:
        lines.append("  Fork hooks do not run with this start method; the Dataset is pickled into each worker.")
    options = report["options"]
    lines.append(
        "Options: "
        + ", ".join(f"{k}={v!r}" for k, v in options.items() if k != "disable_hooks")
        + (f", disable_hooks={options['disable_hooks']}" if options["disable_hooks"] else "")
    )
    lines += ["", "Fork hooks and backends (in run order):"]
    for hook in report["hooks"]:
        mark = "on " if hook["active"] else "off"
        lines.append(f"  [{mark}] {hook['name']:<20} {hook['state']}")
        lines.append(f"        {hook['does']}")
    hazards = report["live_at_fork"]
    if not hazards:
        lines += ["", "Live at fork: nothing (no native threads, pools, open HDF5/npz files, CUDA or other threads)."]
    for status, heading, mark, label in _SECTIONS:
        items = [h for h in hazards if h["status"] == status]
        if items:
            lines += ["", heading]
        for hazard in items:
            lines.append(f"  [{mark}] {hazard['what']}")
            lines.append(
                f"         {label}: {hazard['handled_by'] if status in ('handled', 'harmless') else hazard['remedy']}"
            )
    pools = report["process"]["pools"]
    if pools:
        lines += ["", "Thread pools configured (threadpoolctl; only live ones are listed above):"]
        lines += [f"  {p['library']} ({p['api']}): {p['threads']} thread(s), {p['path']}" for p in pools]
    notes = report["process"]["notes"]
    if notes:
        lines += ["", "Notes:"] + [f"  {note}" for note in notes]
    lines += ["", report["summary"]]
    return "\n".join(lines)
