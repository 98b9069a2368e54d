"""The report of an Omnivore study: `omnikeras report STORAGE --out DIR` from Python.

```python
from omnikeras.report import load_study, write_report

study = load_study("sqlite:///runs/omnivore.db")
write_report(study, "runs/report")  # runs/report/index.html and its PNG figures
```
"""

from omnikeras.report.figures import Figure, draw_figures
from omnikeras.report.html import mean_prediction_error, write_report
from omnikeras.report.study import ReportError, load_study

__all__ = ["Figure", "ReportError", "draw_figures", "load_study", "mean_prediction_error", "write_report"]
