import pytest

import ngnn.transformers
from ngnn import transformers as ngt


@pytest.fixture(params=ngnn.transformers.transformer_choices())
def transformer_factory(request):
    return lambda **kw: ngt.make_transformer(request.param, **kw)
