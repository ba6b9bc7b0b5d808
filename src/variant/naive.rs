use super::*;
pub struct Naive { pub safe: bool }
pub static NAIVE: Naive = Naive { safe: true };
pub static NAIVE_UNSAFE: Naive = Naive { safe: false };
static I: VariantInfo = VariantInfo { name: "naive", description: "", source: "", modes: &[Mode::Fwd], default_q_chunk: None, default_kv_chunk: None, numerically_safe: true };
static IU: VariantInfo = VariantInfo { name: "naive-unsafe", description: "", source: "", modes: &[Mode::Fwd], default_q_chunk: None, default_kv_chunk: None, numerically_safe: false };
impl Variant for Naive {
    fn info(&self) -> &'static VariantInfo { if self.safe { &I } else { &IU } }
    fn predict_workspace_bytes(&self, _c: &Case) -> u64 { 0 }
    fn forward_cpu(&self, _c: &Case, _i: &Inputs, _o: &mut [f32]) -> Result<()> { Ok(()) }
}
