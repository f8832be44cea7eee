"""A progress display on stderr for solves, reproductions and ``fedmodel serve``.

:class:`Progress` draws a tqdm bar when tqdm is installed, else plain lines; its
:meth:`Progress.describe` is the text of one history row (the outer iteration, rounds and
residuals), which ``fedmodel serve`` also prints for a deployed run. It sits below the
command line (:mod:`fedmodel.cli`) and the Flower app (:mod:`fedmodel.flower_app`), which
both use it.
"""

from __future__ import annotations

import sys
import time


class Progress:
    """A progress display on stderr for solves and reproductions.

    Use :meth:`callback` as the ``callback`` option of ``prox-al``/``cprox-al``: it shows
    the outer iteration, the communication rounds and the current KKT residuals. For a
    sequence of runs give ``total`` and call :meth:`advance` after each run.

    Parameters
    ----------
    desc : str
        Label in front of the bar.
    total : int, optional
        Number of runs (a reproduction's solves); ``None`` counts outer iterations.
    enabled : bool
        False draws nothing (``--quiet``).
    stream : file, optional
        Where to draw (default ``sys.stderr``).
    use_tqdm : bool, optional
        Force (or forbid) tqdm; default: use it when installed.

    Examples
    --------
    >>> p = Progress("prox-al", enabled=False)
    >>> p.callback({"iteration": 0, "rounds": 12, "stationarity": 1e-2, "feasibility": 0.0})
    >>> p.close()
    """

    def __init__(
        self,
        desc: str = "",
        total: int | None = None,
        enabled: bool = True,
        stream=None,
        use_tqdm: bool | None = None,
    ):
        self.desc = desc
        self.total = total
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.count = 0
        self._bar = None
        self._last_print = 0.0
        self._postfix = ""
        self._tqdm = None
        if not enabled:
            return
        if use_tqdm is None or use_tqdm:
            try:
                from tqdm import tqdm
            except ImportError:
                if use_tqdm:
                    raise
            else:
                self._tqdm = tqdm

    def _ensure_bar(self):
        """The tqdm bar, created at the first update (so an early error prints no bar)."""
        if self._bar is None and self._tqdm is not None:
            # a solve has no known total: the outer iteration, rounds and residuals and the
            # elapsed time, without tqdm's rate ("1it [00:00, 53773.13it/s]" said nothing)
            counting = None if self.total else "{desc}{postfix} [{elapsed}]"
            self._bar = self._tqdm(
                total=self.total,
                desc=self.desc,
                file=self.stream,
                leave=True,
                unit="run" if self.total else "it",
                dynamic_ncols=True,
                bar_format=counting,
            )
            if self.count:
                self._bar.update(self.count)
        return self._bar

    @staticmethod
    def describe(row: dict) -> str:
        """Text shown for one history row."""
        parts = [f"outer {row.get('iteration', 0) + 1}"]
        if row.get("rounds"):
            parts.append(f"rounds {row['rounds']}")
        for key, short in (
            ("stationarity", "stat"),
            ("feasibility", "feas"),
            ("max_violation", "viol"),
        ):
            if row.get(key) is not None:
                parts.append(f"{short} {float(row[key]):.1e}")
        return ", ".join(parts)

    def callback(self, row: dict) -> None:
        """The solver callback: one call per outer iteration."""
        if not self.enabled:
            return
        self._postfix = self.describe(row)
        if self._ensure_bar() is not None:
            if self.total is None:
                self._bar.update(1)
            self._bar.set_postfix_str(self._postfix, refresh=True)
        else:
            self._line()

    def set_description(self, desc: str) -> None:
        """Change the label (e.g. the run a reproduction is on)."""
        self.desc = desc
        if not self.enabled:
            return
        if self._ensure_bar() is not None:
            self._bar.set_description_str(desc, refresh=True)
        else:
            self._line(force=True)

    def advance(self, n: int = 1) -> None:
        """Count ``n`` finished runs."""
        if not self.enabled:
            self.count += n
            return
        bar = self._ensure_bar()
        self.count += n
        if bar is not None:
            bar.update(n)
        else:
            self._line(force=True)

    def _line(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_print < 1.0:
            return
        self._last_print = now
        head = f"[{self.count}/{self.total}] " if self.total else ""
        text = f"{self.desc}: {head}{self._postfix}".rstrip(": ")
        print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def make_progress(desc: str, total: int | None = None, enabled: bool = True) -> Progress:
    """A :class:`Progress` on stderr (used by reproductions and the commands)."""
    return Progress(desc, total=total, enabled=enabled)
