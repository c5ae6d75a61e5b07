import pytest

from ngnn import transformers as ngt

# (transformer name, options): every op and layer test runs on each. "numpy-unfused" runs
# the NumPy transformer with fusion off, so every test checks both pipelines.
BACKENDS = {"numpy": ("numpy", {}), "numpy-unfused": ("numpy", {"fusion": False})}
BACKENDS.update({name: (name, {}) for name in ngt.transformer_choices() if name != "numpy"})


@pytest.fixture(params=list(BACKENDS))
def transformer_factory(request):
    """`make(**options)` creates a transformer of the parametrized kind; every transformer
    made is closed at teardown, so a failing test does not leak device memory."""
    name, defaults = BACKENDS[request.param]
    made = []

    def make(**options):
        t = ngt.make_transformer(name, **{**defaults, **options})
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


def pytest_collection_modifyitems(items):
    """Tests marked `after_all` run last: the nvcc test compiles every kernel the tests
    before it generated."""
    items.sort(key=lambda item: item.get_closest_marker("after_all") is not None)


def pytest_configure(config):
    config.addinivalue_line("markers", "after_all: run after every other test")
