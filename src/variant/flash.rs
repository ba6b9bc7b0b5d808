use super::*;
pub struct Fl { pub safe: bool }
pub static FLASH: Fl = Fl { safe: true };

static I: VariantInfo = VariantInfo { name: "flash", description: "", source: "", modes: &[Mode::Fwd], default_q_chunk: Some(64), default_kv_chunk: Some(256), numerically_safe: true };
static IU: VariantInfo = VariantInfo { name: "naive-unsafe", description: "", source: "", modes: &[Mode::Fwd], default_q_chunk: None, default_kv_chunk: None, numerically_safe: false };
impl Variant for Fl {
    fn info(&self) -> &'static VariantInfo { if self.safe { &I } else { &IU } }
    fn predict_workspace_bytes(&self, _c: &Case) -> u64 { 0 }
    fn forward_cpu(&self, _c: &Case, _i: &Inputs, _o: &mut [f32]) -> Result<()> { Ok(()) }
}
