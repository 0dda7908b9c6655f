"""SGD, SGD with momentum and Adam on lesson 05's MNIST classifier: validation accuracy after the same steps.

Run:  .venv/bin/python bench/optimizers.py [--steps 600]
Each optimizer starts from the same weights and sees the same batches; the printout is one row per optimizer.
"""
import argparse
import numpy as np
import fastad as fd
from fastad.data import load_mnist

class Classifier(fd.Layer):
    "Pixels -> hidden ReLU layer -> ten logits (lesson 05's model)."
    hidden: fd.Dense
    output: fd.Dense
    def forward(self, x): return self.output(self.hidden(x))

def fresh():
    rng = np.random.default_rng(0)
    return Classifier(fd.Dense(784, 100, activation=fd.relu, rng=rng), fd.Dense(100, 10, activation=None, rng=rng))

def loss_of(model, x, y): return fd.softmax_cross_entropy(model(x), y)
def accuracy(model, x, y): return float((model(x).argmax(-1) == y).mean())

def train(make_optimizer, data, steps, batch_size=64):
    x_train, y_train, x_valid, y_valid = data
    model, order = fresh(), np.random.default_rng(1)
    optimizer = make_optimizer(model)
    batches = (idx for _ in iter(int, 1) for idx in np.array_split(order.permutation(len(y_train)), len(y_train) // batch_size))
    for _, idx in zip(range(steps), batches):
        model = optimizer.update(model, along=fd.gradient(lambda m: loss_of(m, x_train[idx], y_train[idx]), model))
    return accuracy(model, x_valid, y_valid), float(loss_of(model, x_valid, y_valid))

OPTIMIZERS = {
    'SGD, learning rate 0.2': lambda m: fd.SGD(m, 0.2),
    'SGD, learning rate 0.02, momentum 0.9': lambda m: fd.SGD(m, 0.02, momentum=0.9),
    'Adam, learning rate 1e-3': lambda m: fd.Adam(m, 1e-3),
}

if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--steps', type=int, default=600)
    steps = parser.parse_args().steps
    data = load_mnist(verbose=True)
    print(f"{steps} steps of 64 digits, {len(data[1])} training and {len(data[3])} validation digits")
    for name, make in OPTIMIZERS.items():
        acc, loss = train(make, data, steps)
        print(f"{name:<40} validation accuracy {acc:.3f}   validation loss {loss:.3f}")
