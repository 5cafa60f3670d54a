//! Per-cause arrays serialised as maps from the cause's name (`{"sync": 3, ...}`), as
//! the counters document shows them.

use serde::ser::{SerializeMap, Serializer};

/// `values[i]` under `names[i]`.
pub(crate) fn map<S: Serializer, T: serde::Serialize>(
    names: impl ExactSizeIterator<Item = &'static str>,
    values: &[T],
    s: S,
) -> Result<S::Ok, S::Error> {
    let mut m = s.serialize_map(Some(names.len()))?;
    for (name, v) in names.zip(values) {
        m.serialize_entry(name, v)?;
    }
    m.end()
}
