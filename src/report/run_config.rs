//! What a report reads of the config embedded in `meta.json`: the memory budget the rows
//! were measured under, the paper table the config joined, the depth of the model a layer
//! case belongs to and the Tree-vs-Ring `[model]`. O(1) lookups in the JSON.

use crate::config::paper::PaperTable;
use crate::config::{ByteSize, ModelConfig};
use crate::error::{Error, Result};
use crate::results::load::Results;

/// The config of a loaded results directory, as reports need it.
pub trait RunConfig {
    /// `run.memory_budget` of the config that produced the rows.
    fn memory_budget(&self) -> Option<u64>;
    /// The paper table the config joined (`[report] paper_table`), as embedded in meta.json.
    fn paper(&self) -> Option<PaperTable>;
    /// `run.model_layers`: the depth of the model a layer case belongs to.
    fn model_layers(&self) -> Option<usize>;
    /// `[model]`, the Tree-vs-Ring model, when the config had one. `Err` when meta.json
    /// holds one this attnbench cannot read.
    fn model(&self) -> Result<Option<ModelConfig>>;
    /// `[report] reference`: the variant the summary compares the others with.
    fn reference(&self) -> Option<String>;
}

impl RunConfig for Results {
    fn memory_budget(&self) -> Option<u64> {
        let v = self
            .meta
            .as_ref()?
            .config
            .get("run")?
            .get("memory_budget")?;
        serde_json::from_value::<ByteSize>(v.clone())
            .ok()
            .map(|b| b.bytes())
    }

    fn paper(&self) -> Option<PaperTable> {
        let v = self.meta.as_ref()?.config.get("report")?.get("paper")?;
        serde_json::from_value(v.clone()).ok()
    }

    fn model_layers(&self) -> Option<usize> {
        let v = self.meta.as_ref()?.config.get("run")?.get("model_layers")?;
        serde_json::from_value(v.clone()).ok()
    }

    fn reference(&self) -> Option<String> {
        let v = self.meta.as_ref()?.config.get("report")?.get("reference")?;
        v.as_str().map(str::to_string)
    }

    fn model(&self) -> Result<Option<ModelConfig>> {
        let Some(v) = self.meta.as_ref().and_then(|m| m.config.get("model")) else {
            return Ok(None);
        };
        serde_json::from_value(v.clone())
            .map(Some)
            .map_err(|e| Error::Usage(format!("meta.json: config.model: {e}")))
    }
}
