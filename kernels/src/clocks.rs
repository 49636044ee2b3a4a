//! Sampled device clocks through NVML, read-only.
//!
//! A background thread polls the SM and memory clocks, temperature, power
//! and the clock-event ("throttle") reasons every `period`; a timing row
//! asks for the samples that fall inside its measured window
//! (`Timing::measured_from_s..measured_to_s`). NVML is loaded at run time
//! (libnvidia-ml.so.1 ships with the driver); when it cannot be loaded the
//! sampler does not start and the caller records a note instead. Nothing
//! here changes a clock or any other device setting.

use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::Nvml;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use thiserror::Error;

/// A row is flagged as throttled when its lowest sampled SM clock is more
/// than this fraction below the highest SM clock sampled over the run.
pub const THROTTLE_FRACTION: f64 = 0.05;

/// Seconds since a process-wide monotonic epoch (the first call). Timing
/// windows and clock samples use this same clock.
pub fn now_s() -> f64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_secs_f64()
}

#[derive(Debug, Error)]
pub enum ClockError {
    #[error("NVML unavailable ({0}); clocks are not sampled")]
    Unavailable(String),
    #[error("NVML has no device with PCI bus id {bus_id}: {err}")]
    NoDevice { bus_id: String, err: String },
}

/// What NVML says about the device and the driver once, at start.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceFacts {
    /// Driver version string, e.g. "580.65.06".
    pub driver: String,
    pub nvml_version: String,
    pub name: String,
    /// Highest SM and memory clocks the device supports, MHz.
    pub max_sm_mhz: Option<u32>,
    pub max_mem_mhz: Option<u32>,
    /// Enforced power limit, W.
    pub power_limit_w: Option<f64>,
}

/// One poll of the device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClockSample {
    /// `now_s()` when the sample was taken.
    pub t: f64,
    pub sm_mhz: u32,
    pub mem_mhz: u32,
    pub temp_c: Option<u32>,
    pub power_w: Option<f64>,
    /// NVML clock-event reason bits (`nvmlClocksEventReason*`), 0 if unknown.
    pub reasons: u64,
}

/// The samples of one window, reduced.
#[derive(Clone, Debug, PartialEq)]
pub struct ClockWindow {
    pub samples: usize,
    pub sm_min_mhz: u32,
    pub sm_max_mhz: u32,
    pub sm_mean_mhz: f64,
    pub mem_min_mhz: u32,
    pub mem_max_mhz: u32,
    pub temp_max_c: Option<u32>,
    pub power_max_w: Option<f64>,
    /// The reasons seen in any sample, OR-ed, "GPU idle" excluded.
    pub reasons: u64,
}

/// NVML reason bits and their names (values of nvml.h's
/// `nvmlClocksEventReason*` / `nvmlClocksThrottleReason*` macros).
const REASONS: &[(u64, &str)] = &[
    (0x0000_0001, "gpu_idle"),
    (0x0000_0002, "applications_clocks"),
    (0x0000_0004, "sw_power_cap"),
    (0x0000_0008, "hw_slowdown"),
    (0x0000_0010, "sync_boost"),
    (0x0000_0020, "sw_thermal"),
    (0x0000_0040, "hw_thermal"),
    (0x0000_0080, "hw_power_brake"),
    (0x0000_0100, "display_clocks"),
];

const GPU_IDLE: u64 = 0x1;

/// "sw_power_cap+hw_thermal" for a reason mask ("" for none; unknown bits
/// are written in hex).
pub fn reason_names(mask: u64) -> String {
    let mut names: Vec<String> = Vec::new();
    let mut rest = mask;
    for &(bit, name) in REASONS {
        if mask & bit != 0 {
            names.push(name.to_string());
            rest &= !bit;
        }
    }
    if rest != 0 {
        names.push(format!("{rest:#x}"));
    }
    names.join("+")
}

/// Reduces samples to a window; None when there are none.
pub fn summarize(samples: &[ClockSample]) -> Option<ClockWindow> {
    if samples.is_empty() {
        return None;
    }
    let sm_sum: f64 = samples.iter().map(|s| s.sm_mhz as f64).sum();
    Some(ClockWindow {
        samples: samples.len(),
        sm_min_mhz: samples.iter().map(|s| s.sm_mhz).min().unwrap_or(0),
        sm_max_mhz: samples.iter().map(|s| s.sm_mhz).max().unwrap_or(0),
        sm_mean_mhz: sm_sum / samples.len() as f64,
        mem_min_mhz: samples.iter().map(|s| s.mem_mhz).min().unwrap_or(0),
        mem_max_mhz: samples.iter().map(|s| s.mem_mhz).max().unwrap_or(0),
        temp_max_c: samples.iter().filter_map(|s| s.temp_c).max(),
        power_max_w: samples
            .iter()
            .filter_map(|s| s.power_w)
            .fold(None, |a: Option<f64>, p| Some(a.map_or(p, |a| a.max(p)))),
        reasons: samples.iter().fold(0, |a, s| a | s.reasons) & !GPU_IDLE,
    })
}

/// The samples taken in `[from, to]` out of `samples` in time order; when
/// none fall inside (a window shorter than the polling period), the last
/// sample taken before `from` if it was taken at or after `busy_from` (the
/// start of the same work's warm-up, so it saw the device busy); otherwise
/// none, rather than a sample of an idle device.
pub fn select_window(
    samples: &[ClockSample],
    busy_from: f64,
    from: f64,
    to: f64,
) -> Vec<ClockSample> {
    let lo = samples.partition_point(|s| s.t < from);
    let hi = samples.partition_point(|s| s.t <= to);
    if lo < hi {
        samples[lo..hi].to_vec()
    } else if lo > 0 && samples[lo - 1].t >= busy_from {
        vec![samples[lo - 1]]
    } else {
        Vec::new()
    }
}

/// Whether a row whose lowest SM clock was `row_min` fell more than
/// `THROTTLE_FRACTION` below the run's highest SM clock `run_max`.
pub fn throttled(row_min: u32, run_max: u32) -> bool {
    run_max > 0 && (row_min as f64) < (1.0 - THROTTLE_FRACTION) * run_max as f64
}

/// The NVML polling thread. Dropping it stops and joins the thread.
pub struct ClockSampler {
    samples: Arc<Mutex<Vec<ClockSample>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    facts: DeviceFacts,
    period: Duration,
}

fn poll(dev: &nvml_wrapper::Device<'_>) -> Option<ClockSample> {
    let t = now_s();
    let sm_mhz = dev.clock_info(Clock::SM).ok()?;
    let mem_mhz = dev.clock_info(Clock::Memory).ok()?;
    Some(ClockSample {
        t,
        sm_mhz,
        mem_mhz,
        temp_c: dev.temperature(TemperatureSensor::Gpu).ok(),
        power_w: dev.power_usage().ok().map(|mw| mw as f64 / 1000.0),
        reasons: dev
            .current_throttle_reasons()
            .map(|r| r.bits())
            .unwrap_or(0),
    })
}

impl ClockSampler {
    /// Starts polling the device with PCI bus id `bus_id` ("0000:3b:00.0",
    /// as `DeviceInfo::pci_bus_id`; NVML's device 0 when empty) every
    /// `period`. Returns once NVML is loaded and the first sample is taken.
    pub fn start(bus_id: &str, period: Duration) -> Result<ClockSampler, ClockError> {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel::<Result<DeviceFacts, ClockError>>();
        let (s2, stop2) = (samples.clone(), stop.clone());
        let bus = bus_id.to_string();
        // NVML's handles borrow the library object, so the thread owns both.
        let thread = std::thread::Builder::new()
            .name("gemtune-nvml".into())
            .spawn(move || {
                let nvml = match Nvml::init() {
                    Ok(n) => n,
                    Err(e) => {
                        let _ = tx.send(Err(ClockError::Unavailable(e.to_string())));
                        return;
                    }
                };
                // By bus id, as CUDA and NVML may number devices apart;
                // with a single device there is nothing to confuse.
                let dev = if bus.is_empty() {
                    nvml.device_by_index(0)
                } else {
                    nvml.device_by_pci_bus_id(bus.as_str())
                        .or_else(|e| match nvml.device_count() {
                            Ok(1) => nvml.device_by_index(0),
                            _ => Err(e),
                        })
                };
                let dev = match dev {
                    Ok(d) => d,
                    Err(e) => {
                        let _ = tx.send(Err(ClockError::NoDevice {
                            bus_id: bus.clone(),
                            err: e.to_string(),
                        }));
                        return;
                    }
                };
                let facts = DeviceFacts {
                    driver: nvml.sys_driver_version().unwrap_or_default(),
                    nvml_version: nvml.sys_nvml_version().unwrap_or_default(),
                    name: dev.name().unwrap_or_default(),
                    max_sm_mhz: dev.max_clock_info(Clock::SM).ok(),
                    max_mem_mhz: dev.max_clock_info(Clock::Memory).ok(),
                    power_limit_w: dev.enforced_power_limit().ok().map(|mw| mw as f64 / 1000.0),
                };
                if let Some(s) = poll(&dev) {
                    if let Ok(mut v) = s2.lock() {
                        v.push(s);
                    }
                }
                if tx.send(Ok(facts)).is_err() {
                    return;
                }
                while !stop2.load(Ordering::Relaxed) {
                    std::thread::sleep(period);
                    if let Some(s) = poll(&dev) {
                        if let Ok(mut v) = s2.lock() {
                            v.push(s);
                        }
                    }
                }
            })
            .map_err(|e| ClockError::Unavailable(format!("cannot start the sampler: {e}")))?;
        let facts = match rx.recv() {
            Ok(Ok(f)) => f,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(ClockError::Unavailable(
                    "the sampler thread ended before reporting".into(),
                ));
            }
        };
        Ok(ClockSampler {
            samples,
            stop,
            thread: Some(thread),
            facts,
            period,
        })
    }

    pub fn facts(&self) -> &DeviceFacts {
        &self.facts
    }

    pub fn period(&self) -> Duration {
        self.period
    }

    /// Every sample so far.
    pub fn samples(&self) -> Vec<ClockSample> {
        self.samples.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// The reduced samples of `[from, to]` (see `select_window`).
    pub fn window(&self, busy_from: f64, from: f64, to: f64) -> Option<ClockWindow> {
        let all = self.samples.lock().ok()?;
        summarize(&select_window(&all, busy_from, from, to))
    }
}

impl Drop for ClockSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(t: f64, sm: u32, reasons: u64) -> ClockSample {
        ClockSample {
            t,
            sm_mhz: sm,
            mem_mhz: 2619,
            temp_c: Some(40 + sm / 1000),
            power_w: Some(sm as f64 / 10.0),
            reasons,
        }
    }

    #[test]
    fn windows_take_the_samples_inside_or_the_last_one_before() {
        let v = vec![
            s(0.0, 345, 1),
            s(1.0, 1980, 0),
            s(2.0, 1755, 4),
            s(3.0, 1980, 0),
        ];
        let w = summarize(&select_window(&v, 0.0, 0.5, 2.5)).unwrap();
        assert_eq!(w.samples, 2);
        assert_eq!((w.sm_min_mhz, w.sm_max_mhz), (1755, 1980));
        assert_eq!(w.sm_mean_mhz, (1755.0 + 1980.0) / 2.0);
        assert_eq!(w.reasons, 4);
        assert_eq!(reason_names(w.reasons), "sw_power_cap");
        assert_eq!(w.power_max_w, Some(198.0));
        assert_eq!(w.temp_max_c, Some(41));
        // A window between two samples reads the one before it when that
        // one was taken after the warm-up began...
        let w = summarize(&select_window(&v, 0.9, 1.2, 1.4)).unwrap();
        assert_eq!((w.samples, w.sm_min_mhz), (1, 1980));
        // ...and nothing when it predates the warm-up (an idle device).
        assert!(summarize(&select_window(&v, 1.1, 1.2, 1.4)).is_none());
        // Idle is not a reason worth reporting.
        let w = summarize(&select_window(&v, -1.0, -1.0, 0.5)).unwrap();
        assert_eq!(w.reasons, 0);
        assert!(summarize(&select_window(&v, -3.0, -2.0, -1.0)).is_none());
    }

    /// Without NVML (this CPU machine) the sampler is a typed error, not a
    /// panic; with it, the thread starts, samples and stops on drop.
    #[test]
    fn sampler_starts_or_says_why() {
        match ClockSampler::start("", Duration::from_millis(1)) {
            Ok(c) => {
                assert!(!c.samples().is_empty());
                assert!(c.window(0.0, 0.0, now_s()).is_some());
            }
            Err(e) => assert!(e.to_string().contains("NVML"), "{e}"),
        }
    }

    #[test]
    fn throttle_flag_and_reason_names() {
        assert!(!throttled(1980, 1980));
        assert!(!throttled(1890, 1980)); // 4.5% below
        assert!(throttled(1870, 1980)); // 5.6% below
        assert!(!throttled(0, 0));
        assert_eq!(reason_names(0), "");
        assert_eq!(reason_names(0x4 | 0x40), "sw_power_cap+hw_thermal");
        assert_eq!(reason_names(0x8 | 0x1000), "hw_slowdown+0x1000");
    }
}
