"""Base layer: what every other part of the engine may import (errors, progress, file helpers)."""
