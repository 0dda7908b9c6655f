"""fastad: learn, and use, reverse-mode automatic differentiation with plain NumPy (CuPy on a GPU).

The modules are generated from the notebooks in nbs/; this file only gathers the public names."""
__version__ = "0.0.1"

from .errors import *
from .backend import set_backend, use_backend, get_backend, use_gpu, gpu_available, to_host, to_device
from .primitives import relu, logsumexp, log_softmax
from .logs_and_collector import trace, trace_primitives
from . import traced_array, in_place     # Traced's operators, methods and NumPy's protocols; x op= y and x[key] = v
from . import dispatch                    # declares the NumPy adapters in the registry's rows
from . import linalg                      # and those of numpy.linalg
from .dispatch import put_along_axis
from .tree import Differentiable, nondifferentiable, tree_map
from .transforms import (gradient, value_with_gradient, pullback, value_with_pullback, derivative, registered_derivative, Registration,
                         differentiable_function, without_derivative, with_derivative, ZeroDerivativeWarning,
                         applied_for_backpropagation)
from .layers import Layer, Dense, Sequential, sequenced, mse, SGD, Adam, AdamW
from .cnn import Conv2D, MaxPool2D, Flatten, conv2d, max_pool2d, softmax_cross_entropy
from .drawing import draw, tape_of, TapeListing
from .forward import differential, value_with_differential, jacobian, hessian, hessian_vector_product, ravel
from .checkpointing import (make_recomputed_in_gradient, with_recomputation_in_pullbacks, random_state, replaying,
                            ActivationDiscarding, checkpoint_sequential, BudgetWarning)
from .schedules import Schedule, constant_schedule, step_schedule, warmup_cosine_schedule
from .clipping import global_norm, clip_by_global_norm
from .saving import save, load
from .batching import batches
from .more_layers import LayerNorm, Dropout, Embedding, set_training
from .jit import jit, JitError, JitWarning
from .data_parallel import all_reduce_mean, shards, dask_value_with_gradient   # Dask is imported only when called
from . import backend, primitives, engine, dispatch, transforms, layers, cnn, checkpointing, planner, memory, drawing, forward, progress
from . import scipy_rules; scipy_rules.install()   # SciPy's functions, differentiated once SciPy is imported (none of it is imported here)
from .scipy_rules import supported_functions        # NumPy's (fastad.dispatch) and SciPy's
