//! Helpers the GPU test binaries share: the GPU (a test without one
//! panics with the reason instead of passing), a compiled variant, and
//! define maps.
#![allow(dead_code)]

use gemtune_kernels::compile::{compile, default_cache_dir, Arch, CompiledVariant};
use gemtune_kernels::defines::{DefineValue, Defines};
use gemtune_kernels::family::Family;
use gemtune_kernels::Gpu;

pub fn gpu() -> Gpu {
    Gpu::new(0).unwrap_or_else(|e| panic!("this test needs a CUDA GPU: {e}"))
}

pub fn build(gpu: &Gpu, f: &dyn Family, d: &Defines) -> CompiledVariant {
    build_for(gpu.arch(), f, d)
}

/// The same for an arch without a GPU handle (compiles on worker threads).
pub fn build_for(arch: Arch, f: &dyn Family, d: &Defines) -> CompiledVariant {
    compile(f, d, arch, default_cache_dir().as_deref())
        .unwrap_or_else(|e| panic!("compile failed: {e}"))
}

/// `d` with `kv` set.
pub fn with(mut d: Defines, kv: &[(&str, DefineValue)]) -> Defines {
    for (k, v) in kv {
        d.insert(k.to_string(), v.clone());
    }
    d
}

pub fn i(v: i64) -> DefineValue {
    DefineValue::Int(v)
}
pub fn s(v: &str) -> DefineValue {
    DefineValue::Str(v.into())
}
