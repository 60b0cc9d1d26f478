//! NVML: devices and per-process used memory. Initialised once; every call
//! is blocking, so the collector runs `poll` off the async runtime. A value
//! NVML cannot read is absent, never 0.

use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;

use vramscope_core::input::{Gpu, GpuProcess, Machine};

/// An initialised NVML, or the one-line reason it is unavailable.
pub(crate) struct NvmlSource {
    nvml: Result<Nvml, String>,
}

impl NvmlSource {
    pub(crate) fn init() -> Self {
        let nvml = Nvml::init().map_err(|e| {
            let why = match e {
                nvml_wrapper::error::NvmlError::LibloadingError(_) => {
                    "libnvidia-ml.so.1 not found (no NVIDIA driver)".to_string()
                }
                e => e.to_string(),
            };
            format!("NVML unavailable: {why}; showing instrumented and simulated processes only")
        });
        NvmlSource { nvml }
    }

    /// NVML when `enabled`, else a source that says it was disabled.
    pub(crate) fn new(enabled: bool) -> Self {
        if enabled {
            NvmlSource::init()
        } else {
            NvmlSource::disabled("NVML disabled (--no-nvml)")
        }
    }

    /// A source that never reads NVML (tests, `--no-nvml`).
    pub(crate) fn disabled(why: &str) -> Self {
        NvmlSource {
            nvml: Err(why.to_string()),
        }
    }

    pub(crate) fn available(&self) -> bool {
        self.nvml.is_ok()
    }

    /// Reads every device and its compute processes.
    pub(crate) fn poll(&self, now_ns: u64) -> Machine {
        let nvml = match &self.nvml {
            Ok(n) => n,
            Err(why) => {
                return Machine {
                    nvml_error: Some(why.clone()),
                    ..Machine::default()
                };
            }
        };
        let mut m = Machine {
            nvml_error: None,
            driver_version: nvml.sys_driver_version().ok(),
            sampled_ns: Some(now_ns),
            ..Machine::default()
        };
        let count = match nvml.device_count() {
            Ok(c) => c,
            Err(e) => {
                m.nvml_error = Some(format!("NVML could not count devices: {e}"));
                return m;
            }
        };
        for index in 0..count {
            let dev = match nvml.device_by_index(index) {
                Ok(d) => d,
                Err(e) => {
                    m.gpus.push(Gpu {
                        index,
                        name: format!("unreadable: {e}"),
                        uuid: None,
                        total: None,
                        used: None,
                        free: None,
                        util_gpu: None,
                        util_mem: None,
                        temperature_c: None,
                        power_w: None,
                    });
                    continue;
                }
            };
            let mem = dev.memory_info().ok();
            let util = dev.utilization_rates().ok();
            m.gpus.push(Gpu {
                index,
                name: dev.name().unwrap_or_else(|_| format!("GPU {index}")),
                uuid: dev.uuid().ok(),
                total: mem.as_ref().map(|x| x.total),
                used: mem.as_ref().map(|x| x.used),
                free: mem.as_ref().map(|x| x.free),
                util_gpu: util.as_ref().map(|u| u.gpu),
                util_mem: util.as_ref().map(|u| u.memory),
                temperature_c: dev.temperature(TemperatureSensor::Gpu).ok(),
                power_w: dev.power_usage().ok().map(|mw| mw as f64 / 1000.0),
            });
            if let Ok(procs) = dev.running_compute_processes() {
                for p in procs {
                    m.processes.push(GpuProcess {
                        pid: p.pid,
                        gpu: index,
                        used: match p.used_gpu_memory {
                            UsedGpuMemory::Used(b) => Some(b),
                            UsedGpuMemory::Unavailable => None,
                        },
                    });
                }
            }
        }
        m
    }
}
