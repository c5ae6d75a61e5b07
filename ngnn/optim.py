"""Optimizers as in-graph updates.

`opt.updates(loss)` returns ng.assign ops for the parameters and for the optimizer's own
state (momentum buffers, Adam moments, the step counter), so

    step = t.computation([loss] + opt.updates(loss), x, y)

is one training step that runs entirely on the transformer's device. Every read within a
call sees the old values, so the parameter update is written in terms of the new state
expressions, never of the state variables themselves.

Weight decay adds `weight_decay * p` to the gradient (L2, as torch.optim.SGD and Adam do).
It is one number for every parameter, or a list with one per parameter, as torch's
parameter groups allow (GCNII decays its convolutions and its dense layers differently:
`model.weight_decays(conv, dense)`).

A learning-rate schedule (`schedule=StepLR(step_size, gamma)`, torch.optim.lr_scheduler's
step decay) holds the rate in a scalar variable that the updates read, instead of folding a
constant into them: a trainer writes each epoch's rate there (`start_epoch`) and the
compiled step runs on, never recompiled. Without a schedule the rate stays a constant.
"""
import numpy as np

import ngnn as ng
from ngnn.op_graph import Variable


class StepLR:
    """The rate times `gamma` every `step_size` epochs, as torch.optim.lr_scheduler.StepLR
    (the GIN paper's: step_size 50, gamma 0.5)."""

    def __init__(self, step_size, gamma):
        if isinstance(step_size, bool) or not isinstance(step_size, (int, np.integer)) or \
                step_size <= 0:
            raise ValueError(f"StepLR: step_size (epochs between decays) must be an integer "
                             f">= 1, got {step_size!r}")
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float, np.floating)) or \
                not np.isfinite(gamma) or gamma <= 0:
            raise ValueError(f"StepLR: gamma (the factor of each decay) must be a finite "
                             f"number > 0, got {gamma!r}")
        self.step_size, self.gamma = int(step_size), float(gamma)

    def rate(self, lr, epoch):
        """The rate of epoch `epoch` (from 0) for the initial rate `lr`. Multiplied once per
        decay, as torch's StepLR does, so the values equal its bit for bit."""
        for _ in range(epoch // self.step_size):
            lr *= self.gamma
        return lr

    def __repr__(self):
        return f"StepLR(step_size={self.step_size}, gamma={self.gamma})"


class Optimizer:
    def __init__(self, params, lr, weight_decay=0.0, schedule=None):
        self.params = list(params)
        if not self.params:
            raise ValueError(f"{type(self).__name__}: no parameters to optimize")
        for p in self.params:
            if not isinstance(p, Variable):
                raise TypeError(f"{type(self).__name__}: parameters must be ng.variable ops, "
                                f"got {p!r}")
        if len(set(self.params)) != len(self.params):
            raise ValueError(f"{type(self).__name__}: a parameter is listed twice")
        if lr <= 0:
            raise ValueError(f"{type(self).__name__}: lr must be positive, got {lr}")
        decays = np.asarray(weight_decay, dtype=np.float64)
        if decays.ndim == 0:
            decays = np.full(len(self.params), decays)
        if decays.shape != (len(self.params),) or np.any(decays < 0):
            raise ValueError(f"{type(self).__name__}: weight_decay must be a number >= 0 or "
                             f"one per parameter ({len(self.params)}), got {weight_decay!r}")
        self.lr = float(lr)
        self.weight_decays = [float(d) for d in decays]
        self.state = []          # (name, variable) of the optimizer's own state
        if schedule is not None and not isinstance(schedule, StepLR):
            raise TypeError(f"{type(self).__name__}: schedule must be an optim.StepLR or "
                            f"None, got {schedule!r}")
        self.schedule = schedule
        # Not in `state`: the schedule rewrites it from the epoch, so checkpoints leave it out.
        self.rate = self.lr if schedule is None else ng.variable(
            (), dtype=np.result_type(*[p.dtype for p in self.params]),
            initial_value=self.lr, name="lr", trainable=False)

    def _state_variable(self, name, shape, dtype=np.float32):
        var = ng.variable(shape, dtype=dtype, initial_value=0.0, name=name, trainable=False)
        self.state.append((name, var))
        return var

    def named_state(self):
        """[(name, variable)] of the optimizer state, for checkpoints."""
        return list(self.state)

    def lr_at(self, epoch):
        """The rate of epoch `epoch` (from 0): the schedule's, else the constant `lr`."""
        return self.lr if self.schedule is None else self.schedule.rate(self.lr, epoch)

    def start_epoch(self, transformer, epoch):
        """Writes epoch `epoch`'s rate to the rate variable on `transformer` (nothing to do
        without a schedule). Every trainer calls it before an epoch's steps."""
        if self.schedule is not None:
            transformer.set_variable(self.rate, self.lr_at(epoch))

    def gradients(self, loss, reduce=None):
        grads = ng.grad(loss, self.params)
        if reduce is not None:
            grads = [reduce(g) for g in grads]
        return [g + decay * p if decay else g
                for g, p, decay in zip(grads, self.params, self.weight_decays)]

    def updates(self, loss, reduce=None):
        """The assignments of one step that lowers `loss`. `reduce`, when given, maps each
        raw gradient before weight decay is added (distributed training all-reduces the
        ranks' partial gradients there)."""
        if not isinstance(loss, ng.Op) or loss.shape != ():
            raise ValueError(f"{type(self).__name__}.updates: the loss must be a scalar op, "
                             f"got {loss!r}")
        return self.apply(self.gradients(loss, reduce))

    def apply(self, grads):
        raise TypeError(f"{type(self).__name__} must implement apply()")


def _state_name(index, what):
    # By position: layers of one kind share variable names, positions are unique.
    return f"param{index}.{what}"


class SGD(Optimizer):
    """p -= lr * b with b = momentum * b + g (b starts at 0, so the first step is lr * g),
    the update rule of torch.optim.SGD without dampening or Nesterov."""

    def __init__(self, params, lr, momentum=0.0, weight_decay=0.0, schedule=None):
        super().__init__(params, lr, weight_decay, schedule)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"SGD: momentum must be in [0, 1), got {momentum}")
        self.momentum = float(momentum)
        self.buffers = [self._state_variable(_state_name(i, "momentum"), p.shape, p.dtype)
                        for i, p in enumerate(self.params)] if self.momentum else None

    def apply(self, grads):
        if not self.momentum:
            return [ng.assign(p, p - self.rate * g) for p, g in zip(self.params, grads)]
        updates = []
        for p, g, buf in zip(self.params, grads, self.buffers):
            new_buf = self.momentum * buf + g
            updates += [ng.assign(buf, new_buf), ng.assign(p, p - self.rate * new_buf)]
        return updates


class Adam(Optimizer):
    """Kingma & Ba (2015) with bias correction; the step counter is a variable so the
    correction advances on the device.

    The update runs over the parameters packed end to end: the moments are one flat
    variable each per dtype (`adam_m`, `adam_v`), the gradients and the parameters are
    concatenated (flattened, in `params` order) and every step of the rule is one
    whole-buffer op, instead of a dozen ops on each parameter (GIN-0's 42 parameters
    made some 460 small NumPy calls). Each element sees the same float ops as in a
    per-parameter update, so the values are the same bit for bit."""

    def __init__(self, params, lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 schedule=None):
        super().__init__(params, lr, weight_decay, schedule)
        beta1, beta2 = betas
        if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
            raise ValueError(f"Adam: betas must be in [0, 1), got {betas}")
        self.beta1, self.beta2, self.eps = float(beta1), float(beta2), float(eps)
        self.step = self._state_variable("adam.step", ())
        # One pack per dtype, parameters in their listed order within it.
        self.packs = []
        for dtype in dict.fromkeys(np.dtype(p.dtype) for p in self.params):
            members = [i for i, p in enumerate(self.params) if np.dtype(p.dtype) == dtype]
            size = sum(self.params[i].size for i in members)
            suffix = "" if not self.packs else f".{dtype.name}"
            self.packs.append((members,
                               self._state_variable(f"adam_m{suffix}", (size,), dtype),
                               self._state_variable(f"adam_v{suffix}", (size,), dtype)))

    def apply(self, grads):
        step = self.step + 1.0
        # lr * sqrt(1 - beta2^t) / (1 - beta1^t) folds both bias corrections into one scalar.
        scale = self.rate * ng.sqrt(1.0 - ng.constant(self.beta2) ** step) / \
            (1.0 - ng.constant(self.beta1) ** step)
        eps = self.eps * ng.sqrt(1.0 - ng.constant(self.beta2) ** step)
        updates = [ng.assign(self.step, step)]
        for members, m, v in self.packs:
            g = _packed([grads[i] for i in members])
            p = _packed([self.params[i] for i in members])
            new_m = self.beta1 * m + (1.0 - self.beta1) * g
            new_v = self.beta2 * v + (1.0 - self.beta2) * g * g
            new_p = p - scale * new_m / (ng.sqrt(new_v) + eps)
            updates += [ng.assign(m, new_m), ng.assign(v, new_v)]
            start = 0
            for i in members:
                param = self.params[i]
                piece = ng.slice(new_p, (slice(start, start + param.size),))
                updates.append(ng.assign(param, ng.reshape(piece, param.shape)))
                start += param.size
        return updates


def _packed(tensors):
    """The tensors flattened and laid end to end: one (total,) tensor."""
    flat = [ng.reshape(t, (t.size,)) for t in tensors]
    return flat[0] if len(flat) == 1 else ng.concat(flat, axis=0)
