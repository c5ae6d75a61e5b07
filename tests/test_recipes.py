"""Recipes (ngnn/recipes.py): `ngnn train` takes the published hyper-parameters of the model
on the dataset, says which, and lets the command line override each value."""
import dataclasses

import numpy as np
import pytest

from ngnn import recipes
from ngnn.cli import main, make_parser
from ngnn.recipes import fill_defaults, load_dataset, make_trainer
from ngnn.train import normalize_features


@pytest.mark.parametrize("model, dataset, source, hidden, normalized", [
    ("gcn", "cora", "Kipf & Welling 2017", 16, True),
    ("gcn", "citeseer", "Kipf & Welling 2017", 16, True),
    ("gat", "cora", "Veličković et al. 2018", 8, True),
    ("gcn", "amazon_photo", "Shchur et al. 2018", 64, False),
    ("gcn", "coauthor_cs", "Shchur et al. 2018", 64, False),
    ("gat", "amazon_computers", "Shchur et al. 2018", 8, False),
    ("sage", "amazon_photo", "ngnn default", 64, True),
    ("gcn", "sbm", "ngnn default: Kipf & Welling's Cora recipe", 16, True)])
def test_the_table_picks_the_paper_of_the_model_and_dataset(model, dataset, source, hidden,
                                                            normalized):
    chosen = recipes.recipe(model, dataset)
    assert (chosen.source, chosen.hidden, chosen.normalize_features) == \
        (source, hidden, normalized)


def test_shchur_recipes_are_the_papers_configurations():
    gcn, gat = recipes.recipe("gcn", "amazon_photo"), recipes.recipe("gat", "coauthor_cs")
    assert (gcn.dropout, gcn.lr, gcn.weight_decay, gcn.patience) == (0.8, 0.01, 1e-3, 50)
    assert (gat.heads, gat.dropout, gat.attention_dropout(), gat.lr, gat.weight_decay) == \
        (8, 0.6, 0.3, 0.01, 1e-2)
    with pytest.raises(ValueError, match="unknown model 'mlp'"):
        recipes.recipe("mlp", "cora")


def args_for(*argv):
    args = make_parser().parse_args(["train", *argv])
    fill_defaults(args)
    return args


def test_the_command_line_trains_with_the_recipe_unless_told_otherwise():
    args = args_for("--model", "gat", "--dataset", "amazon_photo")
    assert args.recipe == ("recipe: gat on amazon_photo (Shchur et al. 2018): hidden 8 x 8 "
                           "heads, dropout 0.6, attention dropout 0.3, lr 0.01, weight decay "
                           "0.01, up to 1000 epochs (patience 50), raw features")
    data = load_dataset(args)
    trainer = make_trainer(args, data, seed=0)
    try:
        conv1 = trainer.model.layers[0][1]
        assert conv1.fc.shape == (data.num_features, 64)
        assert (conv1.feat_drop, conv1.attn_drop) == (0.6, 0.3)
        assert trainer.optimizer.lr == 0.01 and set(trainer.optimizer.weight_decays) == {0.01}
        np.testing.assert_array_equal(trainer.features.toarray() if trainer.sparse
                                      else trainer.features, data.dense_features())
    finally:
        trainer.transformer.close()

    args = args_for("--model", "gat", "--dataset", "amazon_photo", "--hidden", "4",
                    "--heads", "2", "--attn-dropout", "0.1", "--lr", "0.02",
                    "--weight-decay", "0", "--epochs", "3", "--patience", "0",
                    "--normalize-features")
    assert args.recipe.endswith("; from the command line: hidden, lr, weight decay, epochs, "
                                "patience, normalize features, heads, attn dropout")
    assert (args.hidden, args.heads, args.attn_dropout, args.lr, args.weight_decay,
            args.epochs, args.patience, args.normalize_features) == \
        (4, 2, 0.1, 0.02, 0.0, 3, None, True)
    trainer = make_trainer(args, data, seed=0)
    try:
        assert trainer.model.layers[0][1].fc.shape == (data.num_features, 8)
        features = trainer.features.toarray() if trainer.sparse else trainer.features
        np.testing.assert_allclose(features, normalize_features(data.dense_features()))
    finally:
        trainer.transformer.close()


def test_train_prints_the_recipe_line(capsys):
    assert main(["train", "--model", "gcn", "--dataset", "cora", "--epochs", "2",
                 "--no-progress", "--dropout", "0.3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == ("recipe: gcn on cora (Kipf & Welling 2017): hidden 16, dropout 0.3, "
                        "lr 0.01, weight decay 0.0005, up to 2 epochs, row-normalized "
                        "features; from the command line: dropout, epochs")


def test_attention_dropout_is_gat_only(capsys):
    assert main(["train", "--model", "gcn", "--attn-dropout", "0.1"]) == 1
    assert "--attn-dropout applies to gat only" in capsys.readouterr().err


def test_every_recipe_field_is_a_command_line_option():
    options = vars(make_parser().parse_args(["train"]))
    fields = {f.name for f in dataclasses.fields(recipes.Recipe)} - {"source"}
    assert fields <= set(options)
