"""A one-page report (HTML + Markdown + PNG plots) comparing training runs from their run folders."""

from regroup.report.build import build_report
from regroup.report.summary import summarize_runs

__all__ = ["build_report", "summarize_runs"]
