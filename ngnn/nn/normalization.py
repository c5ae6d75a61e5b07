"""nn.BatchNorm: ng.batch_norm with a learned scale and shift and the running statistics
that evaluation normalizes with, as torch.nn.BatchNorm1d keeps them."""
import numpy as np

import ngnn as ng

from .layers import Layer


class BatchNorm(Layer):
    """Batch normalization of `num_features` node features. Called as
    `norm(h, training, batch=None)`: in training, by the statistics of the rows of h (the
    real nodes of `batch`, a BatchedGraph or a GraphLoader slot, when given), and it records
    in `updates` the assignments moving the running mean and variance (unbiased, as torch
    keeps it) by `momentum` towards them; in evaluation, by the running statistics."""

    def __init__(self, num_features, momentum=0.1, eps=1e-5, dtype=np.float32):
        super().__init__(0, dtype)
        if not 0.0 < momentum <= 1.0:
            raise ValueError(f"BatchNorm: momentum must be in (0, 1], got {momentum}")
        self.momentum, self.eps = float(momentum), float(eps)
        self.weight = self.variable("weight", (num_features,), np.ones(num_features))
        self.bias = self.variable("bias", (num_features,), np.zeros(num_features))
        self.running_mean = ng.variable((num_features,), dtype=self.dtype,
                                        initial_value=np.zeros(num_features),
                                        name="batchnorm.running_mean")
        self.running_var = ng.variable((num_features,), dtype=self.dtype,
                                       initial_value=np.ones(num_features),
                                       name="batchnorm.running_var")
        self.updates = []

    def buffers(self):
        return [self.running_mean, self.running_var]

    def __call__(self, h, training=False, batch=None):
        if not training:
            scale = self.weight / ng.sqrt(self.running_var + self.eps)
            return (h - self.running_mean) * scale + self.bias
        y, mean, var, count = ng.batch_norm(h, self.weight, self.bias, self.eps, batch)
        unbiased = var * count / ng.maximum(count - 1.0, 1.0)
        m = self.momentum
        self.updates = [
            ng.assign(self.running_mean,
                      (1.0 - m) * self.running_mean + m * ng.stop_gradient(mean)),
            ng.assign(self.running_var,
                      (1.0 - m) * self.running_var + m * ng.stop_gradient(unbiased))]
        return y
