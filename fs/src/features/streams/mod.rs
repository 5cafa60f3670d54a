//! Snapshot streams: the difference of two trees, send, receive, and the jobs of the
//! administration tree that run them.

pub(crate) mod host;
pub mod jobs;
pub mod receive;
pub mod send;
pub mod treediff;

/// The streams' service: the send and receive jobs of the administration tree, and the
/// lock one receive or rollback holds. Its operations (`send`, `receive`, `jobs`) read
/// snapshot views as `vfs::FileSystem`s and change the live tree through the handle's
/// own `FileSystem` operations, so they take the filesystem they run on as a
/// [`StreamHost`](host::StreamHost), which the handle implements.
pub(crate) struct Streams {
    /// The send and receive jobs of the administration tree.
    pub(crate) jobs: jobs::StreamJobs,
    /// Held by a receive or a rollback (`receive`): one changes the live tree at a time.
    pub(crate) receive_lock: async_lock::Mutex<()>,
}

impl Streams {
    pub(crate) fn new(stream_buffer: usize) -> Streams {
        Streams {
            jobs: jobs::StreamJobs::new(stream_buffer),
            receive_lock: async_lock::Mutex::new(()),
        }
    }
}
