"""How the variables of a model are stacked into one flat vector ``x``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import cvxpy as cp
import numpy as np
import scipy.sparse as sp
from cvxpy.expressions.variable import Variable
from numpy.typing import ArrayLike

from fedmodel.cached import cached_property


# ----------------------------------------------------------------------------------------
# Variable layout
# ----------------------------------------------------------------------------------------
class VariableLayout:
    """Stack several cvxpy Variables into one flat vector ``x``.

    Each variable is flattened in column-major (``'F'``) order -- cvxpy's ``vec``
    convention -- and the blocks are concatenated in the given order.

    Parameters
    ----------
    variables : sequence of cvxpy.Variable
        The model variables, without duplicates.
    owners : mapping from variable id to party name, optional
        Party-owned variables (``party.variable(...)``); the others are shared.
    hidden : iterable of variable ids, optional
        Epigraph auxiliaries introduced by the DSL (left out of ``res.solution``).

    Attributes
    ----------
    variables : tuple of cvxpy.Variable
        The variables, in stacking order.
    size : int
        Total length ``N`` of the stacked vector.

    Examples
    --------
    >>> import cvxpy as cp, numpy as np
    >>> w, b = cp.Variable((2, 2)), cp.Variable()
    >>> layout = VariableLayout([w, b])
    >>> layout.size, layout.slice_of(b)
    (5, slice(4, 5, None))
    >>> x = layout.stack({w: np.array([[1.0, 2.0], [3.0, 4.0]]), b: 7.0})
    >>> x.tolist()
    [1.0, 3.0, 2.0, 4.0, 7.0]
    >>> layout.unstack(x)[w].tolist()
    [[1.0, 2.0], [3.0, 4.0]]
    """

    def __init__(
        self,
        variables: Sequence[cp.Variable],
        owners: Mapping[int, str] | None = None,
        hidden: Iterable[int] = (),
    ):
        variables = tuple(variables)
        self.owners: dict[int, str] = {
            v.id: owners[v.id] for v in variables if owners and v.id in owners
        }
        self.hidden: frozenset[int] = frozenset(hidden)
        self._slices: dict[int, slice] = {}
        offset = 0
        for var in variables:
            if not isinstance(var, Variable):
                raise TypeError(
                    f"VariableLayout expects cvxpy Variables, got {type(var).__name__}: {var!r}"
                )
            if var.id in self._slices:
                raise ValueError(f"variable {var.name()} appears twice in the layout")
            self._slices[var.id] = slice(offset, offset + var.size)
            offset += var.size
        self.variables: tuple[cp.Variable, ...] = variables
        self.size: int = offset

    def __repr__(self) -> str:
        names = ", ".join(f"{v.name()}{v.shape}" for v in self.variables)
        return f"VariableLayout([{names}], size={self.size})"

    # -- ownership -------------------------------------------------------------------------
    def owner_of(self, var: cp.Variable) -> str | None:
        """The party owning ``var`` (``None`` for a shared variable)."""
        return self.owners.get(var.id)

    @cached_property
    def shared_variables(self) -> tuple[cp.Variable, ...]:
        """The variables no party owns, in stacking order (a layout does not change once
        made: found once)."""
        return tuple(v for v in self.variables if v.id not in self.owners)

    def owned_by(self, party: str) -> tuple[cp.Variable, ...]:
        """The variables owned by ``party``, in stacking order."""
        return tuple(v for v in self.variables if self.owners.get(v.id) == party)

    @property
    def has_owned(self) -> bool:
        return bool(self.owners)

    @cached_property
    def n_shared(self) -> int:
        """Entries of the shared variables, which come first in every layout a compiled
        model builds (the global one and each party's :meth:`local` one)."""
        return sum(v.size for v in self.shared_variables)

    def indices(self, variables: Iterable[cp.Variable]) -> np.ndarray:
        """Positions in ``x`` of the given variables' entries (in the given order)."""
        parts = [np.arange(self.slice_of(v).start, self.slice_of(v).stop) for v in variables]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=int)

    @property
    def shared_indices(self) -> np.ndarray:
        """Positions in ``x`` of the shared variables' entries."""
        return self.indices(self.shared_variables)

    def local(self, party: str) -> VariableLayout:
        """The layout of what ``party`` works on: the shared variables, then its own."""
        return VariableLayout(
            self.shared_variables + self.owned_by(party), self.owners, self.hidden
        )

    def __contains__(self, var: object) -> bool:
        return isinstance(var, Variable) and var.id in self._slices

    def slice_of(self, var: cp.Variable) -> slice:
        """Return the slice of ``x`` holding ``var`` (flattened in ``'F'`` order).

        Raises
        ------
        ValueError
            If ``var`` is not part of the layout.
        """
        try:
            return self._slices[var.id]
        except (KeyError, AttributeError):
            raise ValueError(f"variable {_var_name(var)} is not in the layout {self!r}") from None

    def stack(
        self, values: Mapping[cp.Variable, ArrayLike] | None = None, default: float = 0.0
    ) -> np.ndarray:
        """Stack variable values into a flat vector.

        Parameters
        ----------
        values : mapping from Variable to array_like, optional
            Values of (some of) the variables; a scalar is broadcast to the variable's
            shape.  Variables that are missing get ``default``.  If ``values`` is None,
            each variable's current ``.value`` is used (``default`` where it is None), the
            inverse of :meth:`write_values`.
        default : float
            Fill value for missing variables.

        Returns
        -------
        numpy.ndarray
            Vector of length :attr:`size`.

        Examples
        --------
        >>> import cvxpy as cp
        >>> u, v = cp.Variable(2), cp.Variable(3)
        >>> VariableLayout([u, v]).stack({v: 1.0}).tolist()
        [0.0, 0.0, 1.0, 1.0, 1.0]
        """
        x = np.full(self.size, float(default))
        if values is None:
            items = [(v, v.value) for v in self.variables if v.value is not None]
        else:
            items = list(values.items())
        for var, val in items:
            sl = self.slice_of(var)
            if sp.issparse(val):
                val = val.toarray()
            arr = np.asarray(val, dtype=float)
            if arr.ndim == 0:
                x[sl] = float(arr)
                continue
            if arr.shape != var.shape and not (arr.ndim == 1 and arr.size == var.size):
                raise ValueError(
                    f"value for variable {var.name()} has shape {arr.shape}, "
                    f"expected {var.shape} (or a flat vector in 'F' order)"
                )
            x[sl] = np.reshape(arr, -1, order="F")
        return x

    def unstack(self, x: ArrayLike) -> dict[cp.Variable, np.ndarray]:
        """Split a flat vector into per-variable arrays of the variables' shapes.

        Parameters
        ----------
        x : array_like
            Vector of length :attr:`size`.

        Returns
        -------
        dict
            ``{variable: array}``; arrays are copies reshaped in ``'F'`` order (0-d arrays
            for scalar variables).
        """
        x = self._check_x(x)
        return {
            var: np.array(np.reshape(x[self._slices[var.id]], var.shape, order="F"))
            for var in self.variables
        }

    def write_values(self, x: ArrayLike) -> None:
        """Set ``var.value`` for every variable from the flat vector ``x``.

        If cvxpy rejects a value because it violates a variable attribute (e.g. a
        ``nonneg=True`` variable receiving ``-1e-12``), the value is projected onto the
        attribute set with ``var.project`` first.
        """
        for var, val in self.unstack(x).items():
            try:
                var.value = val
            except ValueError:
                var.value = var.project(val)

    def _check_x(self, x: ArrayLike) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        if x.ndim != 1 or x.shape[0] != self.size:
            x = x.reshape(-1)
            if x.shape[0] != self.size:
                raise ValueError(f"x has length {x.shape[0]}, the layout has size {self.size}")
        return x


def _var_name(var: Any) -> str:
    try:
        return f"'{var.name()}' (id {var.id}, shape {var.shape})"
    except Exception:  # pragma: no cover - defensive
        return repr(var)
