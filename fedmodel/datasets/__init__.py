"""Real data sets bundled with fedmodel, and federated splitters.

Loaders return a :class:`Dataset` built from the package's own compressed copies of the
data (``fedmodel/datasets/data``, provenance and licences in ``data/PROVENANCE.md``);
nothing is downloaded. Splitters cut a data set into client parts.

Examples
--------
>>> from fedmodel.datasets import load_breast_cancer, split_stratified
>>> ds = load_breast_cancer()
>>> parts = split_stratified(ds.X, ds.y, n_clients=5, random_state=0)
>>> [len(y) for _, y in parts]
[137, 137, 137, 136, 136]
"""

from ._base import Dataset
from .loaders import (
    list_datasets,
    load,
    load_abalone,
    load_adult,
    load_breast_cancer,
    load_breast_cancer_wisconsin_original,
    load_communities,
    load_compas,
    load_diabetes,
    load_german,
    load_mnist,
    load_monks,
    load_wine_quality,
)
from .splits import split_by_class, split_dirichlet, split_server, split_stratified

__all__ = [
    "Dataset",
    "list_datasets",
    "load",
    "load_abalone",
    "load_adult",
    "load_breast_cancer",
    "load_breast_cancer_wisconsin_original",
    "load_communities",
    "load_compas",
    "load_diabetes",
    "load_german",
    "load_mnist",
    "load_monks",
    "load_wine_quality",
    "split_by_class",
    "split_dirichlet",
    "split_server",
    "split_stratified",
]
