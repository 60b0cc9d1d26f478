//! The metric families of vramscope's exporter, in one table: `serve`
//! writes them ([`serve::exposition`](crate::serve)) and `fleet` asks
//! Prometheus for some of them and reads them back
//! ([`fleet::model`](crate::fleet::model)), so a name is spelled once.
//! Also the label names the exporter writes and the fleet reads.
//!
//! Names follow Prometheus's conventions: a `vramscope_` prefix, base units
//! (`_bytes`, `_ratio` for 0..1), counters end in `_total`. A family's
//! prefix says what a series is of: `vramscope_gpu_` a GPU (NVML),
//! `vramscope_process_` a process (per device where the series has a
//! `device` label). Pure data: no I/O.

/// The label names the exporter writes (Prometheus adds `job` and
/// `instance` when it scrapes; `__name__` is the family's name).
pub(crate) mod label {
    /// This machine's name, on every series.
    pub(crate) const HOST: &str = "host";
    /// The exporter's version (on `vramscope_exporter_info`).
    pub(crate) const VERSION: &str = "version";
    /// A GPU's NVML index.
    pub(crate) const GPU: &str = "gpu";
    /// A GPU's UUID (NVML).
    pub(crate) const UUID: &str = "uuid";
    /// A GPU's product name (NVML).
    pub(crate) const NAME: &str = "name";
    /// A process's host pid.
    pub(crate) const PID: &str = "pid";
    pub(crate) const USER: &str = "user";
    /// A process's label, else its name.
    pub(crate) const PROCESS: &str = "process";
    /// How a process is seen: `exact`, `sampled`, `nvml_only`.
    pub(crate) const MODE: &str = "mode";
    /// The CUDA ordinal a process uses.
    pub(crate) const DEVICE: &str = "device";
    pub(crate) const MODULE: &str = "module";
    pub(crate) const PHASE: &str = "phase";
    pub(crate) const ROLE: &str = "role";
    /// An allocator setting (`PYTORCH_CUDA_ALLOC_CONF`) the advisor tried.
    pub(crate) const CONF: &str = "conf";
    /// Which of the advisor's settings: `own` or `best`.
    pub(crate) const CANDIDATE: &str = "candidate";
    /// What holds memory outside the caching allocator: `context`, else
    /// its library (`NCCL`, `cuBLAS`, …, or its file name).
    pub(crate) const WHAT: &str = "what";
    /// How it holds it: `context`, `allocations`, `VMM`, `kernels`,
    /// `streams`, `pinned host`, ….
    pub(crate) const KIND: &str = "kind";
}

/// A family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Gauge,
    Counter,
}

/// One metric family: its name (a counter's ends in `_total`), type, help.
#[derive(Debug)]
pub(crate) struct Def {
    pub(crate) name: &'static str,
    pub(crate) kind: Kind,
    pub(crate) help: &'static str,
}

const fn gauge(name: &'static str, help: &'static str) -> Def {
    Def {
        name,
        kind: Kind::Gauge,
        help,
    }
}

const fn counter(name: &'static str, help: &'static str) -> Def {
    Def {
        name,
        kind: Kind::Counter,
        help,
    }
}

pub(crate) const EXPORTER_INFO: Def = gauge(
    "vramscope_exporter_info",
    "Always 1: the vramscope exporter on this host, and its version.",
);
pub(crate) const NVML_UP: Def = gauge(
    "vramscope_nvml_up",
    "1 when NVML could be read on this host, else 0.",
);
pub(crate) const PROCESSES: Def = gauge(
    "vramscope_processes",
    "Processes shown: instrumented ones, and GPU processes NVML reports.",
);
pub(crate) const PROBLEMS: Def = gauge(
    "vramscope_segment_problems",
    "Segments the collector could not use (see `vramscope rings`).",
);
pub(crate) const GPU_TOTAL: Def = gauge(
    "vramscope_gpu_memory_total_bytes",
    "Device memory of the GPU (NVML).",
);
pub(crate) const GPU_USED: Def = gauge(
    "vramscope_gpu_memory_used_bytes",
    "Device memory in use on the GPU, by every process (NVML).",
);
pub(crate) const GPU_UTIL: Def = gauge(
    "vramscope_gpu_utilization_ratio",
    "Share of the last sample period during which a kernel ran (NVML), 0 to 1.",
);
pub(crate) const GPU_MEM_UTIL: Def = gauge(
    "vramscope_gpu_memory_utilization_ratio",
    "Share of the last sample period during which device memory was read or written (NVML), 0 to 1.",
);
pub(crate) const P_RUNNING: Def = gauge(
    "vramscope_process_running",
    "1 while the process runs; 0 for an exited one still shown.",
);
pub(crate) const P_NVML_USED: Def = gauge(
    "vramscope_process_nvml_used_bytes",
    "Device memory NVML attributes to the process, all GPUs.",
);
pub(crate) const P_NON_PYTORCH: Def = gauge(
    "vramscope_process_non_pytorch_bytes",
    "NVML's used memory minus the allocator's reserved memory of the same instant: CUDA context, NCCL, cuBLAS workspaces.",
);
pub(crate) const P_OUTSIDE: Def = gauge(
    "vramscope_process_outside_bytes",
    "Memory the process holds outside the caching allocator, as its agent names it (FORMAT 1.3): by what (context, else the library: NCCL, cuBLAS, ..., or its file name; one that begins with ( has one more ( in front) and kind (context, allocations, VMM, stream-ordered, managed, kernels, streams, pinned host, other), per device (none for pinned host memory, which is not the device's); the largest parts of the process, the rest summed in what=\"(other)\" kind=\"(other)\".",
);
pub(crate) const P_UNEXPLAINED: Def = gauge(
    "vramscope_process_unexplained_bytes",
    "vramscope_process_non_pytorch_bytes less the device memory the agent named outside the caching allocator (vramscope_process_outside_bytes): what no one named; absent without NVML or when the agent names nothing.",
);
pub(crate) const P_EVENTS: Def = counter(
    "vramscope_process_events_total",
    "Allocator events received from the process.",
);
pub(crate) const P_LOST: Def = counter(
    "vramscope_process_lost_events_total",
    "Allocator events the process wrote that were overwritten before they were read.",
);
pub(crate) const P_OOMS: Def = counter(
    "vramscope_process_ooms_total",
    "Out-of-memory errors of the caching allocator seen in the process.",
);
pub(crate) const P_STEPS: Def = counter(
    "vramscope_process_steps_total",
    "Training steps seen since watching began, every run's (vramscope.mark(), else optimizer steps, else the period of the allocation pattern); rate() of it is the step rate.",
);
pub(crate) const P_LEAK: Def = gauge(
    "vramscope_process_leak_suspected",
    "1 when the floor of allocated memory keeps rising step after step (a leak), 0 when not; absent until enough steps were seen.",
);
pub(crate) const P_LEAK_GROWTH: Def = gauge(
    "vramscope_process_leak_growth_bytes_per_step",
    "Robust slope of the allocated floor per step (Theil-Sen); absent until enough steps were seen.",
);
pub(crate) const P_OOM_STEP: Def = gauge(
    "vramscope_process_oom_forecast_step",
    "While a leak is flagged, or reserved memory grew at each of the last 8 step boundaries: the step at which the allocator would run out of memory against the memory limit the agent states (the device's memory times the memory fraction): found by replaying the job's last step forward through the simulator where the live advisor follows the process, else projected from that growth; absent otherwise.",
);
pub(crate) const P_OOM_SIMULATED: Def = gauge(
    "vramscope_process_oom_forecast_simulated",
    "While vramscope_process_oom_forecast_step is given: 1 when the simulator found that step (the job's last step replayed forward), 0 when it is projected from the growth.",
);
pub(crate) const P_OOM_SECONDS: Def = gauge(
    "vramscope_process_oom_forecast_seconds",
    "While vramscope_process_oom_forecast_step is given: seconds until that step at the measured step period; absent otherwise.",
);
pub(crate) const P_ADVICE_SAVING: Def = gauge(
    "vramscope_process_advice_saving_bytes",
    "The live advisor's recommendation (serve --advise): bytes of peak reserved memory the setting in the conf label saves against the job's own, replaying the job's requests from where the advisor began (negative where it trades memory for fewer out-of-memory errors); conf=\"\" and 0 where the job's own setting is best; absent until the advisor has chosen its candidates.",
);
pub(crate) const P_ADVICE_OOMS: Def = gauge(
    "vramscope_process_advice_ooms",
    "Out-of-memory errors the replay of a setting had: candidate=\"own\" the job's own, candidate=\"best\" the recommendation (conf label as in vramscope_process_advice_saving_bytes).",
);
pub(crate) const P_ADVICE_REQUESTS: Def = counter(
    "vramscope_process_advice_requests_total",
    "Allocation requests the live advisor replayed under every candidate; it stops growing where the advisor stopped following the job to stay within its share of a core (vramscope_process_advice_following 0).",
);
pub(crate) const P_ADVICE_FOLLOWING: Def = gauge(
    "vramscope_process_advice_following",
    "1 while the live advisor follows the process's allocator events, 0 once it stopped (its advice then covers the requests before).",
);
pub(crate) const P_MODULE: Def = gauge(
    "vramscope_process_module_allocated_bytes",
    "Bytes of live tensors allocated while the module ran (its dotted path); the largest modules of the process, the rest summed in module=\"(other)\", allocations outside every module in module=\"(none)\"; a path that begins with ( has one more ( in front.",
);
pub(crate) const P_PHASE: Def = gauge(
    "vramscope_process_phase_allocated_bytes",
    "Bytes of live tensors by the phase they were allocated in (forward, backward, optimizer, other, unknown).",
);
pub(crate) const P_ROLE: Def = gauge(
    "vramscope_process_role_allocated_bytes",
    "Bytes of live tensors by role: parameter, buffer, gradient, optimizer_state (exact, from the role lists the agent sends, FORMAT 1.2), activation, temporary, other (by lifetime).",
);
pub(crate) const D_ALLOCATED: Def = gauge(
    "vramscope_process_allocated_bytes",
    "Bytes held by tensors (torch.cuda.memory_allocated) on the device.",
);
pub(crate) const D_RESERVED: Def = gauge(
    "vramscope_process_reserved_bytes",
    "Bytes the caching allocator holds from CUDA (torch.cuda.memory_reserved) on the device.",
);
pub(crate) const D_ACTIVE: Def = gauge(
    "vramscope_process_active_bytes",
    "Bytes in active blocks (allocated, or freed but still used by a stream) on the device.",
);
pub(crate) const D_SPLIT: Def = gauge(
    "vramscope_process_inactive_split_bytes",
    "Cached bytes in split segments, which empty_cache cannot return.",
);
pub(crate) const D_PEAK_ALLOCATED: Def = gauge(
    "vramscope_process_allocated_peak_bytes",
    "Peak of allocated bytes on the device since start or the last peak reset.",
);
pub(crate) const D_PEAK_RESERVED: Def = gauge(
    "vramscope_process_reserved_peak_bytes",
    "Peak of reserved bytes on the device since start or the last peak reset.",
);
pub(crate) const D_PEAK_ACTIVE: Def = gauge(
    "vramscope_process_active_peak_bytes",
    "Peak of active bytes on the device since start or the last peak reset.",
);
pub(crate) const D_LARGEST_FREE: Def = gauge(
    "vramscope_process_largest_free_block_bytes",
    "Largest cached free block on the device: the largest request served without asking CUDA.",
);
pub(crate) const D_FRAGMENTATION: Def = gauge(
    "vramscope_process_fragmentation_ratio",
    "Inactive split bytes as a share of reserved bytes, 0 to 1.",
);
pub(crate) const D_RETRIES: Def = counter(
    "vramscope_process_alloc_retries_total",
    "Allocations that failed, freed the cache and retried (num_alloc_retries).",
);
