"""One job of the GPU run: one network trained for its budget (or, in smoke mode, for exactly
:data:`cardseg_gpu.jobs.SMOKE_STEPS` steps), validated, and written to ``OUT`` as it goes.

A job is a :class:`JobTrainer` holding the run's state, with one method per phase
(:meth:`~JobTrainer.setup`, :meth:`~JobTrainer.train_step`, :meth:`~JobTrainer.validate`, the
checkpoint hooks, :meth:`~JobTrainer.save`). The job's checkpoint policy (``keep`` in
:data:`cardseg_gpu.jobs.JOBS`) picks the subclass: :class:`BestWeightsTrainer` keeps the best
validated weights, :class:`MilestonesTrainer` the weights at :data:`cardseg_gpu.jobs.MILESTONES`.
The job's ``kind`` picks its :class:`Objective`, the loss of one batch. :func:`run_job` is the entry.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, Optional

import torch

from cardseg_gpu.device_data import DeviceAugment, as_float, load_pack, noisy_inputs
from cardseg_gpu.jobs import JOB_FILES, JOBS, MILESTONES, PER_FILE, SAVE_EVERY_S, SMOKE_STEPS, lr_factor
from cardseg_gpu.outputs import log_line, save_weights
from cardseg_gpu.validation import validate


@dataclass(frozen=True)
class JobOptions:
    """How the run trains one job (the job's own recipe is its :data:`cardseg_gpu.jobs.JOBS` entry).

    pack: the pack folder (``pack.json``, ``data.npz``: ``build_pack.py``); out: the run's ``OUT``
    folder (``log.jsonl`` and the job's ``.safetensors``); budget_s: the run's training wall-clock
    budget in seconds; batch: slices per step (``None``: the job's own ``batch``); seed: torch's
    seed; smoke: train on the CPU for exactly :data:`cardseg_gpu.jobs.SMOKE_STEPS` steps, validate
    every 2 s and log every 1 s; init_from: a returned fp16 ``.safetensors`` the network starts from
    (``None``: fresh weights); lr_scale: multiplies the job's learning rate; p_uncond: diffusion
    jobs' probability of zeroing the image, unless the job sets its own; val_every_s: seconds
    between validations outside smoke mode; share_with_primary: the primary trains beside this
    job, so a job with a ``budget_frac`` trains for that fraction of ``budget_s`` only."""

    pack: Path
    out: Path
    budget_s: float
    batch: Optional[int] = None
    seed: int = 0
    smoke: bool = False
    init_from: Optional[str] = None
    lr_scale: float = 1.0
    p_uncond: float = 0.2
    val_every_s: float = 30.0
    share_with_primary: bool = True


def _cloned(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """A detached copy of a state dict."""
    return {n: p.detach().clone() for n, p in state.items()}


class Objective:
    """A job kind's training loss: :meth:`loss` of one augmented batch (images ``(B, 1, N, N)``
    float in ``[0, 1]``, labels ``(B, N, N)`` long), the forward pass under the trainer's autocast."""

    def __init__(self, trainer: "JobTrainer"):
        self.trainer = trainer

    def loss(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class DiffusionObjective(Objective):
    """The diffusion recipe: noised state and step drawn on the device, the variational loss."""

    def __init__(self, trainer: "JobTrainer"):
        from cardseg_train.training.losses import DiffusionLoss

        super().__init__(trainer)
        self.loss_fn = DiffusionLoss(trainer.schedule)

    def loss(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        tr = self.trainer
        with tr.autocast:
            images, x_t, t = noisy_inputs(
                tr.schedule,
                images,
                labels,
                tr.k,
                p_uncond=tr.p_uncond,
                p_focus=tr.p_focus,
                focus_steps=tr.sampling_steps,
            )
            logits = tr.net(images, x_t, t)
        return self.loss_fn(logits.float(), labels, x_t, t)[0]


class AleatoricObjective(Objective):
    """The aleatoric segmentor: mean logits and log-variance heads, Kendall and Gal's loss."""

    def __init__(self, trainer: "JobTrainer"):
        from cardseg_train.training.losses import AleatoricLoss

        super().__init__(trainer)
        self.loss_fn = AleatoricLoss()

    def loss(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        with self.trainer.autocast:
            logits, log_var = self.trainer.net.heads(images)
        return self.loss_fn(logits.float(), log_var.float(), labels)[0]


class DeterministicObjective(Objective):
    """A plain segmentor: one forward pass, the segmentation loss."""

    def __init__(self, trainer: "JobTrainer"):
        from cardseg_train.training.losses import SegmentationLoss

        super().__init__(trainer)
        self.loss_fn = SegmentationLoss()

    def loss(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        with self.trainer.autocast:
            logits = self.trainer.net(images)
        return self.loss_fn(logits.float(), labels)[0]


#: a job's ``kind`` → its objective
OBJECTIVES = {"diffusion": DiffusionObjective, "aleatoric": AleatoricObjective, "deterministic": DeterministicObjective}


class JobTrainer:
    """One job's training: the network, optimiser, EMA, data and clocks of the run, one method per
    phase. :meth:`run` drives them: :meth:`setup`, then :meth:`train_step` until the budget (or
    the step limit) is spent, with the checkpoint hooks after each step (:meth:`after_step`,
    :meth:`periodic_validation`, :meth:`save` every :data:`cardseg_gpu.jobs.SAVE_EVERY_S`), then
    :meth:`finish` and the ``done`` line. Subclasses (one per ``keep`` policy) fill in the hooks."""

    def __init__(self, name: str, options: JobOptions):
        self.name = name
        self.options = options
        self.out = Path(options.out)
        job = JOBS[name]
        self.job = job
        budget_s = options.budget_s
        if options.share_with_primary:  # the lower-priority jobs leave the GPU to the primary's annealing
            budget_s = budget_s * float(job.get("budget_frac", 1.0))
        self.budget_s = budget_s
        self.batch = int(options.batch) if options.batch else int(job.get("batch", 32))
        self.max_steps = SMOKE_STEPS if options.smoke else int(job.get("max_steps", 10**9))
        self.cuda = torch.cuda.is_available() and not options.smoke
        self.device = torch.device("cuda" if self.cuda else "cpu")
        self.lr = job["lr"] * options.lr_scale
        self.p_uncond = float(job.get("p_uncond", options.p_uncond))  # a job's own recipe wins over the run's default
        self.p_focus = float(job.get("p_focus", 0.0))
        self.files = [self.out / f for f in JOB_FILES[name]]
        self.val_every = 2.0 if options.smoke else options.val_every_s
        self.log_every = 1.0 if options.smoke else 15.0
        self.step = 0

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        """Seed torch, load the pack onto the device, build the network (from ``init_from`` when
        given), the objective, augmentation, optimiser, EMA and the run's ``base`` record."""
        from cardseg.method.diffusion import CategoricalSchedule, default_sampling_steps
        from cardseg.method.networks import build_network

        torch.manual_seed(self.options.seed)
        if self.cuda:
            torch.backends.cudnn.benchmark = True
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        self.data = load_pack(Path(self.options.pack), self.device)
        self.k = int(self.data["meta"]["num_classes"])
        self.spec = {**self.job["spec"], "num_classes": self.k}
        self.net = build_network(self.spec).to(self.device)
        if self.options.init_from:
            self.load_initial_weights(self.options.init_from)
        self.schedule = CategoricalSchedule(50)
        self.sampling_steps = default_sampling_steps(50, 5)
        self.objective = OBJECTIVES[self.job["kind"]](self)
        self.augment = DeviceAugment()
        self.opt = torch.optim.AdamW(self.net.parameters(), lr=self.lr, weight_decay=1e-5)
        self.setup_ema()
        self.autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.cuda)
        self.n_train = self.data["train_images"].shape[0]
        self.base = self.base_record()

    def load_initial_weights(self, path: str) -> None:
        """Continue from weights a previous run returned (fp16 safetensors), cast to the network's dtypes."""
        from safetensors.torch import load_file

        held = load_file(str(path))
        own = self.net.state_dict()
        self.net.load_state_dict({n: held[n].to(own[n].dtype) for n in own})

    def setup_ema(self) -> None:
        """An exponential moving average of the weights (jobs with ``ema``), validated beside them:
        ``self.ema`` holds a float copy of every state-dict entry, ``None`` without one."""
        self.ema = None
        if not self.job.get("ema"):
            return
        state = self.net.state_dict()
        self.ema = {n: p.detach().clone().float() for n, p in state.items()}
        ema_keys = [n for n, p in state.items() if p.is_floating_point()]
        self._ema_live = [state[n] for n in ema_keys]  # views of the live parameters and buffers
        self._ema_shadow = [self.ema[n] for n in ema_keys]

    def base_record(self) -> dict:
        """What every file and the ``start`` and ``done`` lines record of the job."""
        from cardseg.method.networks import count_parameters

        o, meta_pack = self.options, self.data["meta"]
        return {
            "job": self.name,
            "network": {k_: v for k_, v in self.spec.items() if k_ != "num_classes"},
            "parameters": count_parameters(self.net),
            "device": torch.cuda.get_device_name() if self.cuda else "cpu",
            "batch_size": self.batch,
            "budget_s": self.budget_s,
            "lr": self.lr,
            "seed": o.seed,
            "p_uncond": self.p_uncond,
            "p_focus": self.p_focus,
            "init_from": Path(o.init_from).name if o.init_from else None,
            "pack": {
                k_: meta_pack.get(k_)
                for k_ in ("data", "pixel_spacing_mm", "input_size", "preprocessing", "split", "data_sha256")
            },
        }

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict:
        """Set up, train for the budget, finish; returns the ``done`` record (also logged)."""
        self.setup()
        self.log({**self.base, "event": "start", "train_slices": self.n_train})
        self.start_clocks()
        self.net.train()
        while True:
            frac = self.fraction_done()
            if frac >= 1.0 or self.step >= self.max_steps:
                break
            loss = self.train_step(frac)
            self.after_step()
            now = time.perf_counter()
            self.log_train(loss, now)
            self.periodic_validation(now)
            if time.perf_counter() - self.last_save >= SAVE_EVERY_S:
                self.save()
                self.last_save = time.perf_counter()
        self.finish()  # the end of the budget: a last validation and the final files
        summary = {
            **self.base,
            "event": "done",
            "steps": self.step,
            "elapsed_s": self.elapsed_s(),
            **self.summary_fields(),
        }
        self.log(summary)
        return summary

    def start_clocks(self) -> None:
        self.last_save = time.perf_counter()
        self.t0 = time.perf_counter()
        self.t_val, self.t_log = self.t0, self.t0
        self.n_sum = 0

    def elapsed_s(self) -> float:
        return round(time.perf_counter() - self.t0, 1)

    def fraction_done(self) -> float:
        """How much of the job is done: of its steps in smoke mode, else of its time budget."""
        elapsed = time.perf_counter() - self.t0
        return self.step / self.max_steps if self.options.smoke else elapsed / self.budget_s

    def train_step(self, frac: float) -> torch.Tensor:
        """One optimisation step at the fraction ``frac`` of the budget (its learning rate): a
        random batch, augmented, its loss, clipped gradients, then the EMA. Returns the loss."""
        for g in self.opt.param_groups:
            g["lr"] = self.lr * lr_factor(frac)
        data = self.data
        idx = torch.randint(0, self.n_train, (self.batch,), device=self.device)
        img, lab = self.augment(as_float(data["train_images"][idx]), data["train_labels"][idx].long())
        loss = self.objective.loss(img, lab)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.net.parameters(), 1.0)
        self.opt.step()
        self.step += 1
        self.n_sum += 1
        self.update_ema()
        return loss

    def update_ema(self) -> None:
        if self.ema is None:
            return
        d = min(self.job["ema"], (1 + self.step) / (10 + self.step))
        with torch.no_grad():
            torch._foreach_lerp_(self._ema_shadow, self._ema_live, 1 - d)

    def log_train(self, loss: torch.Tensor, now: float) -> None:
        """A ``train`` line once every ``log_every`` seconds."""
        if now - self.t_log < self.log_every:
            return
        self.log(
            {
                "job": self.name,
                "event": "train",
                "step": self.step,
                "loss": round(float(loss.detach()), 5),
                "lr": self.opt.param_groups[0]["lr"],
                "steps_per_s": round(self.n_sum / (now - self.t_log), 2),
                "elapsed_s": round(now - self.t0, 1),
            }
        )
        self.t_log, self.n_sum = now, 0

    def log(self, record: dict) -> None:
        log_line(self.out, record)

    # ------------------------------------------------------------------ validation
    def weight_sets(self) -> Iterable[str]:
        """The weights validated: the live ones, and the EMA's beside them when the job keeps one."""
        return ("raw", "ema") if self.ema is not None else ("raw",)

    def validate(self, weights: str = "raw") -> dict:
        """Mean Dice on the pack's validation volumes (:func:`cardseg_gpu.validation.validate`) of the
        live weights (``raw``) or of the EMA's (``ema``: loaded for the call, the live ones put back)."""
        if weights != "ema":
            return self._validate_net()
        raw = _cloned(self.net.state_dict())
        self.net.load_state_dict({n: v.to(raw[n].dtype) for n, v in self.ema.items()})
        v = self._validate_net()
        self.net.load_state_dict(raw)
        return v

    def _validate_net(self) -> dict:
        return validate(
            self.net, self.data["val_volumes"], self.job["kind"], self.schedule, self.sampling_steps, self.k
        )

    # ------------------------------------------------------------------ checkpoint hooks
    def after_step(self) -> None:
        """Called after every optimisation step."""

    def periodic_validation(self, now: float) -> None:
        """Called after every step with the step's clock."""

    def save(self) -> None:
        """Write the job's files as they stand (every :data:`cardseg_gpu.jobs.SAVE_EVERY_S` and at the end)."""
        raise NotImplementedError

    def finish(self) -> None:
        """The end of the budget: a last validation and the final files."""
        raise NotImplementedError

    def summary_fields(self) -> dict:
        """The ``best`` and ``milestones`` entries of the ``done`` line."""
        raise NotImplementedError


class BestWeightsTrainer(JobTrainer):
    """``keep: best``: validates every ``val_every`` seconds (the live weights and the EMA's) and
    keeps the weights of the highest mean Dice, written to the job's one file."""

    def setup(self) -> None:
        super().setup()
        self.best = {"dice": -1.0, "step": 0, "weights": "raw"}
        self.best_state: Optional[Dict[str, torch.Tensor]] = None

    def periodic_validation(self, now: float) -> None:
        if now - self.t_val >= self.val_every:
            self.validate_and_keep_best()
            self.t_val = time.perf_counter()

    def validate_and_keep_best(self, final: bool = False) -> None:
        """Validate every weight set, log each as a ``val`` line, keep the best so far."""
        for weights in self.weight_sets():
            v = self.validate(weights)
            last = {"final": True} if final else {}
            self.log({"job": self.name, "event": "val", "step": self.step, "weights": weights, **last, **v})
            if v["dice"] > self.best["dice"]:
                self.keep_best(v, weights)

    def keep_best(self, val: dict, weights: str) -> None:
        self.best = {**val, "step": self.step, "weights": weights}
        self.best_state = _cloned(self.ema if weights == "ema" else self.net.state_dict())

    def save(self) -> None:
        if self.best_state is not None:
            meta = {**self.base, "step": self.best["step"], "val": self.best, "elapsed_s": self.elapsed_s()}
            save_weights(self.files[0], self.best_state, meta)

    def finish(self) -> None:
        self.validate_and_keep_best(final=True)
        self.save()

    def summary_fields(self) -> dict:
        return {"best": self.best, "milestones": None}


class MilestonesTrainer(JobTrainer):
    """``keep: milestones``: the weights at each of :data:`cardseg_gpu.jobs.MILESTONES` and at the
    last step, each validated, written :data:`cardseg_gpu.jobs.PER_FILE` to a file (one file holds
    them all when the job has one)."""

    def setup(self) -> None:
        super().setup()
        self.milestones = set(MILESTONES)
        self.kept: Dict[int, Dict[str, torch.Tensor]] = {}
        self.kept_val: Dict[int, dict] = {}

    def after_step(self) -> None:
        if self.step in self.milestones:
            self.keep_milestone()

    def keep_milestone(self, final: bool = False) -> None:
        """Keep the live weights at this step, validate them, log a ``milestone`` line."""
        self.kept[self.step] = _cloned(self.net.state_dict())
        self.kept_val[self.step] = self.validate("raw")
        last = {"final": True} if final else {}
        self.log({"job": self.name, "event": "milestone", "step": self.step, **last, **self.kept_val[self.step]})

    def save(self) -> None:
        order = sorted(self.kept)
        files = self.files
        per = PER_FILE if len(files) > 1 else len(order)  # a single file holds every checkpoint
        for i, path in enumerate(files):
            part = order[i * per : (i + 1) * per] if i < len(files) - 1 else order[i * per :]
            if not part:
                continue
            tensors = {f"step{s}.{n}": v for s in part for n, v in self.kept[s].items()}
            meta = {
                **self.base,
                "checkpoints": {str(s): self.kept_val.get(s, {}) for s in part},
                "elapsed_s": self.elapsed_s(),
            }
            save_weights(path, tensors, meta)

    def finish(self) -> None:
        self.keep_milestone(final=True)
        self.save()

    def summary_fields(self) -> dict:
        return {"best": None, "milestones": sorted(self.kept)}


#: a job's ``keep`` policy → its trainer
TRAINERS = {"best": BestWeightsTrainer, "milestones": MilestonesTrainer}


def trainer_for(name: str, options: JobOptions) -> JobTrainer:
    """The trainer of the job ``name`` (its :data:`cardseg_gpu.jobs.JOBS` ``keep`` policy)."""
    return TRAINERS[JOBS[name]["keep"]](name, options)


def run_job(name: str, options: JobOptions) -> dict:
    """Train the job ``name`` of :data:`cardseg_gpu.jobs.JOBS` as ``options`` say, writing its log
    lines and weight files into ``options.out``; returns the job's ``done`` record."""
    return trainer_for(name, options).run()
