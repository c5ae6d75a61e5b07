"""Ranking metrics of link prediction over the scores of positive and negative pairs:
AUC, average precision, Hits@K and MRR, vectorized in NumPy.

    link_metrics.auc(pos, neg), link_metrics.average_precision(pos, neg)
    link_metrics.hits_at_k(pos, neg, k=50), link_metrics.mrr(pos, neg)

Ties count as in the references: AUC gives a tied positive-negative pair one half (as
scikit-learn's roc_auc_score does), average precision takes tied scores as one threshold
(scikit-learn's average_precision_score), Hits@K counts a positive only above the K-th best
negative (OGB's evaluator), and MRR ranks a positive tied with negatives in the middle of
them (OGB's mean of the optimistic and pessimistic ranks).
"""
import numpy as np
import scipy.stats


def _scores(pos, neg, what, neg_ndim=(1,)):
    pos, neg = np.asarray(pos, dtype=np.float64), np.asarray(neg, dtype=np.float64)
    if pos.ndim != 1 or neg.ndim not in neg_ndim:
        raise ValueError(f"{what}: expected 1-D positive scores and "
                         f"{' or '.join(f'{d}-D' for d in neg_ndim)} negative scores, got "
                         f"shapes {pos.shape} and {neg.shape}")
    if pos.size == 0 or neg.size == 0:
        raise ValueError(f"{what}: needs at least one positive and one negative score, got "
                         f"{pos.size} and {neg.size}")
    if not (np.isfinite(pos).all() and np.isfinite(neg).all()):
        raise ValueError(f"{what}: the scores contain NaN or Inf")
    return pos, neg


def auc(pos, neg):
    """Area under the ROC curve: the chance that a random positive outscores a random
    negative (a tie counts one half), from the positives' average ranks."""
    pos, neg = _scores(pos, neg, "auc")
    ranks = scipy.stats.rankdata(np.concatenate([pos, neg]))[:pos.size]
    return float((ranks.sum() - pos.size * (pos.size + 1) / 2) / (pos.size * neg.size))


def average_precision(pos, neg):
    """Sum over thresholds, from the highest score down, of the precision at the threshold
    times the recall it adds; tied scores are one threshold."""
    pos, neg = _scores(pos, neg, "average_precision")
    scores = np.concatenate([pos, neg])
    labels = np.concatenate([np.ones(pos.size), np.zeros(neg.size)])
    order = np.argsort(-scores, kind="stable")
    scores, labels = scores[order], labels[order]
    last_of_tie = np.flatnonzero(np.append(scores[1:] != scores[:-1], True))
    true_pos = np.cumsum(labels)[last_of_tie]
    precision = true_pos / (last_of_tie + 1)
    recall_gain = np.diff(true_pos, prepend=0.0) / pos.size
    return float(np.sum(recall_gain * precision))


def hits_at_k(pos, neg, k):
    """Share of the positives scored above the k-th highest negative score."""
    pos, neg = _scores(pos, neg, "hits_at_k")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= neg.size:
        raise ValueError(f"hits_at_k: k must be an int in [1, {neg.size}] (the number of "
                         f"negatives), got {k!r}")
    kth = np.partition(neg, neg.size - k)[neg.size - k]
    return float(np.mean(pos > kth))


def mrr(pos, neg):
    """Mean reciprocal rank of each positive among the negatives: `neg` is one array of
    negatives every positive is ranked against, or (positives, m) with each positive's own.
    A positive tied with negatives ranks in the middle of them."""
    pos, neg = _scores(pos, neg, "mrr", neg_ndim=(1, 2))
    if neg.ndim == 2:
        if neg.shape[0] != pos.size:
            raise ValueError(f"mrr: per-positive negatives need one row per positive, got "
                             f"shapes {pos.shape} and {neg.shape}")
        above = np.sum(neg > pos[:, None], axis=1)
        at_least = np.sum(neg >= pos[:, None], axis=1)
    else:
        ordered = np.sort(neg)
        above = neg.size - np.searchsorted(ordered, pos, side="right")
        at_least = neg.size - np.searchsorted(ordered, pos, side="left")
    return float(np.mean(1.0 / (0.5 * (above + at_least) + 1.0)))


def all_metrics(pos, neg, hits=(10, 50, 100)):
    """{"auc", "ap", "mrr", "hits@K" for each K of `hits` that does not exceed the
    negatives}."""
    out = {"auc": auc(pos, neg), "ap": average_precision(pos, neg), "mrr": mrr(pos, neg)}
    for k in hits:
        if k <= np.size(neg):
            out[f"hits@{k}"] = hits_at_k(pos, neg, k)
    return out
