import pytest

from ngnn import transformers as ngt


@pytest.fixture(params=ngt.transformer_choices())
def transformer_factory(request):
    """`make(**options)` creates a transformer of the parametrized kind; every transformer
    made is closed at teardown, so a failing test does not leak device memory."""
    made = []

    def make(**options):
        t = ngt.make_transformer(request.param, **options)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()
