//! What the filesystem keeps of the device in memory besides btree nodes (those are the
//! node cache's, `btree::cache`): file data ([`data`]), and the reads made ahead of
//! sequential readers to fill it ([`readahead`]).

pub mod data;
mod lists;
pub mod readahead;

pub use data::{CacheCounters, DataCache, DataCacheReport, Part, TenantCacheReport, Who};
pub use readahead::{ReadaheadCounters, ReadaheadQueue, ReadaheadRequest};
