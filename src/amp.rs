//! Automatic mixed precision: libtorch's autocast around forward, and for fp16 a
//! dynamic loss scale (torch.amp.GradScaler's rule).
//!
//! tch's `autocast` only switches CUDA's autocast and always to fp16, so ddpbench calls
//! libtorch's own `at::autocast::set_autocast_enabled/_dtype(DeviceType, ...)` for the
//! training device (CPU autocast included, which is how `--amp` is tested on CPU).
//! They are C++ functions of libtorch_cpu.so taking two one-byte enums
//! (`c10::DeviceType`, `c10::ScalarType`) and a bool, which the x86-64 and AArch64 C
//! ABIs pass exactly as C integers; they are looked up by their mangled names.

use anyhow::{bail, Result};
use std::ffi::{c_void, CString};
use tch::{Device, Kind, Tensor};

use crate::record::AmpMode;

type SetEnabled = unsafe extern "C" fn(i8, bool);
type SetDtype = unsafe extern "C" fn(i8, i8);
type ClearCache = unsafe extern "C" fn();

/// `c10::DeviceType` values.
const DEVICE_CPU: i8 = 0;
const DEVICE_CUDA: i8 = 1;
/// `c10::ScalarType` values.
const SCALAR_HALF: i8 = 5;
const SCALAR_BFLOAT16: i8 = 15;

fn lookup(mangled: &str) -> Result<*mut c_void> {
    let name = CString::new(mangled)?;
    // SAFETY: dlsym over the symbols already loaded into the process.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if f.is_null() {
        bail!("libtorch has no {mangled}: --amp needs libtorch 2.4 or newer");
    }
    Ok(f)
}

/// Autocast for one device and dtype, switched on around each forward pass.
pub(crate) struct Autocast {
    set_enabled: SetEnabled,
    clear_cache: ClearCache,
    device_type: i8,
}

impl Autocast {
    /// None for `--amp off`.
    pub(crate) fn new(mode: AmpMode, device: Device) -> Result<Option<Autocast>> {
        let dtype = match mode {
            AmpMode::Off => return Ok(None),
            AmpMode::Fp16 => SCALAR_HALF,
            AmpMode::Bf16 => SCALAR_BFLOAT16,
        };
        let device_type = match device {
            Device::Cpu => DEVICE_CPU,
            Device::Cuda(_) => DEVICE_CUDA,
            other => bail!("--amp: autocast is not supported on {other:?}"),
        };
        // SAFETY: the mangled names are those of the prototypes above (libtorch 2.x).
        unsafe {
            let set_enabled: SetEnabled = std::mem::transmute(lookup("_ZN2at8autocast20set_autocast_enabledEN3c1010DeviceTypeEb")?);
            let set_dtype: SetDtype =
                std::mem::transmute(lookup("_ZN2at8autocast18set_autocast_dtypeEN3c1010DeviceTypeENS1_10ScalarTypeE")?);
            let clear_cache: ClearCache = std::mem::transmute(lookup("_ZN2at8autocast11clear_cacheEv")?);
            set_dtype(device_type, dtype);
            Ok(Some(Autocast {
                set_enabled,
                clear_cache,
                device_type,
            }))
        }
    }

    /// Runs `f` (the forward pass) under autocast. The cast-weight cache is cleared on
    /// the way out, as PyTorch does when leaving `torch.autocast`, so the next step
    /// casts the updated weights.
    pub(crate) fn run<T>(&self, f: impl FnOnce() -> T) -> T {
        // SAFETY: plain setters of libtorch's thread-local autocast state.
        unsafe { (self.set_enabled)(self.device_type, true) };
        let out = f();
        unsafe {
            (self.set_enabled)(self.device_type, false);
            (self.clear_cache)();
        }
        out
    }
}

/// torch.amp.GradScaler's dynamic loss scale: start at 2^16, halve on inf/NaN
/// gradients (and skip that step), double after 2000 clean steps in a row. The scale,
/// its count of clean steps and each step's check live on the device, as GradScaler
/// keeps them, so no step waits for the host to read them.
#[derive(Debug)]
pub(crate) struct LossScaler {
    /// 0-d float32 on the training device.
    scale: Tensor,
    /// Clean steps in a row since the scale last changed, 0-d int32 on the device.
    growth_tracker: Tensor,
}

impl LossScaler {
    pub(crate) const INITIAL: f64 = 65536.0;
    pub(crate) const GROWTH_INTERVAL: i64 = 2000;

    pub(crate) fn new(device: Device) -> LossScaler {
        LossScaler {
            scale: Tensor::full([], Self::INITIAL, (Kind::Float, device)),
            growth_tracker: Tensor::zeros([], (Kind::Int, device)),
        }
    }

    /// The scale the loss is multiplied by (a 0-d float on the device).
    pub(crate) fn scale(&self) -> &Tensor {
        &self.scale
    }

    /// Unscales the gradients held in `grads` in place and returns `found_inf`: a 0-d
    /// float on the device, 1 when any of them is inf/NaN. The gradients of such a step
    /// are zeroed, so that an optimizer gated on `found_inf` multiplies finite updates
    /// by 0 ([`crate::optim::Gate`]).
    pub(crate) fn unscale(&self, grads: &[Tensor]) -> Tensor {
        tch::no_grad(|| {
            let finite = grads
                .iter()
                .map(|b| b.isfinite().all())
                .reduce(|a, b| a.logical_and(&b))
                .unwrap_or_else(|| Tensor::ones([], (Kind::Bool, self.scale.device())));
            let skip = finite.logical_not();
            // 1/scale is a power of two: the same bits as dividing.
            let inv_scale = self.scale.reciprocal();
            for b in grads {
                let mut b = b.shallow_clone();
                let _ = b.g_mul_(&inv_scale).masked_fill_(&skip, 0.0);
            }
            skip.to_kind(Kind::Float)
        })
    }

    /// Halves the scale after a step whose gradients held inf/NaN, doubles it after
    /// 2000 clean steps in a row (libtorch's `_amp_update_scale_`, on the device).
    pub(crate) fn update(&mut self, found_inf: &Tensor) {
        let _ = self
            .scale
            .internal_amp_update_scale_(&self.growth_tracker, found_inf, 2.0, 0.5, Self::GROWTH_INTERVAL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_scale_halves_on_overflow_and_doubles_after_2000_clean_steps() {
        let mut s = LossScaler::new(Device::Cpu);
        let (inf, clean) = (Tensor::from(1.0f32), Tensor::from(0.0f32));
        let scale = |s: &LossScaler| s.scale().double_value(&[]);
        assert_eq!(scale(&s), 65536.0);
        s.update(&inf);
        assert_eq!(scale(&s), 32768.0);
        for _ in 0..1999 {
            s.update(&clean);
        }
        assert_eq!(scale(&s), 32768.0);
        s.update(&clean);
        assert_eq!(scale(&s), 65536.0);
        // An overflow resets the clean-step count.
        for _ in 0..1000 {
            s.update(&clean);
        }
        s.update(&inf);
        for _ in 0..1999 {
            s.update(&clean);
        }
        assert_eq!(scale(&s), 32768.0);
    }

    #[test]
    fn unscale_divides_by_the_scale_and_zeroes_every_gradient_of_an_overflowing_step() {
        let s = LossScaler::new(Device::Cpu);
        let a = Tensor::from_slice(&[65536.0f32, -131072.0, 3.0]);
        let b = Tensor::from_slice(&[1.0f32]);
        let found = s.unscale(&[a.shallow_clone(), b.shallow_clone()]);
        assert_eq!(found.double_value(&[]), 0.0);
        assert_eq!(Vec::<f32>::try_from(&a).unwrap(), [1.0, -2.0, 3.0 / 65536.0]);
        let _ = b.shallow_clone().fill_(f64::NAN);
        let found = s.unscale(&[a.shallow_clone(), b.shallow_clone()]);
        assert_eq!(found.double_value(&[]), 1.0);
        assert_eq!(
            Vec::<f32>::try_from(&a).unwrap(),
            [0.0; 3],
            "finite gradients of a skipped step are zeroed too"
        );
        assert_eq!(Vec::<f32>::try_from(&b).unwrap(), [0.0]);
    }

    #[test]
    fn cpu_autocast_runs_matmuls_in_the_chosen_dtype_and_switches_off_after() {
        let a = Tensor::ones([4, 4], (Kind::Float, Device::Cpu));
        let ac = Autocast::new(AmpMode::Bf16, Device::Cpu).unwrap().unwrap();
        let inside = ac.run(|| a.matmul(&a));
        assert_eq!(inside.kind(), Kind::BFloat16);
        assert_eq!(a.matmul(&a).kind(), Kind::Float, "autocast must be off outside run()");
        let ac = Autocast::new(AmpMode::Fp16, Device::Cpu).unwrap().unwrap();
        assert_eq!(ac.run(|| a.matmul(&a)).kind(), Kind::Half);
        assert!(Autocast::new(AmpMode::Off, Device::Cpu).unwrap().is_none());
    }
}
