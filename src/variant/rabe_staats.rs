use super::*;
pub struct Rs { pub safe: bool }
pub static RABE_STAATS: Rs = Rs { safe: true };
pub static RABE_STAATS_SEQ: Rs = Rs { safe: false };
static I: VariantInfo = VariantInfo { name: "rabe-staats", description: "", source: "", modes: &[Mode::Fwd], default_q_chunk: Some(1024), default_kv_chunk: Some(4096), numerically_safe: true };
static IU: VariantInfo = VariantInfo { name: "rabe-staats-seq", description: "", source: "", modes: &[Mode::Fwd], default_q_chunk: None, default_kv_chunk: None, numerically_safe: false };
impl Variant for Rs {
    fn info(&self) -> &'static VariantInfo { if self.safe { &I } else { &IU } }
    fn predict_workspace_bytes(&self, _c: &Case) -> u64 { 0 }
    fn forward_cpu(&self, _c: &Case, _i: &Inputs, _o: &mut [f32]) -> Result<()> { Ok(()) }
}
