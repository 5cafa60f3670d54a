//! [`forward_filesystem!`](crate::forward_filesystem): a wrapper's [`FileSystem`] methods
//! that only pass the call on, written once for every wrapper.
//!
//! The compiler holds a wrapper to its lists. A method named after `except` must be
//! written:
//!
//! ```compile_fail,E0046
//! struct Quiet<F>(F);
//! impl<F: vfs::FileSystem> vfs::FileSystem for Quiet<F> {
//!     vfs::forward_filesystem!(self.0; except sync);
//! }
//! ```
//!
//! and one written must be named (else it is defined twice):
//!
//! ```compile_fail,E0201
//! struct Quiet<F>(F);
//! impl<F: vfs::FileSystem> vfs::FileSystem for Quiet<F> {
//!     vfs::forward_filesystem!(self.0);
//!     async fn sync(&self) -> vfs::FsResult<()> {
//!         Ok(())
//!     }
//! }
//! ```
//!
//! while `only` forwards nothing else:
//!
//! ```compile_fail,E0046
//! struct Routed<F>(F);
//! impl<F: vfs::FileSystem> vfs::FileSystem for Routed<F> {
//!     vfs::forward_filesystem!(self.0; only statfs, sync);
//! }
//! ```
//!
//! [`FileSystem`]: crate::FileSystem

/// Writes the [`FileSystem`](crate::FileSystem) methods a wrapper does not change: each
/// calls the same method of the filesystem it wraps with the same arguments. Used
/// inside the wrapper's `impl FileSystem`, beside the methods it writes itself:
///
/// ```
/// use vfs::{FileSystem, FsResult, Ino};
///
/// /// A filesystem whose `fsync` is counted.
/// struct Counted<F> {
///     inner: F,
///     fsyncs: core::sync::atomic::AtomicU64,
/// }
///
/// impl<F: FileSystem> FileSystem for Counted<F> {
///     vfs::forward_filesystem!(self.inner; except fsync);
///
///     async fn fsync(&self, ino: Ino, datasync: bool) -> FsResult<()> {
///         self.fsyncs.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
///         self.inner.fsync(ino, datasync).await
///     }
/// }
/// ```
///
/// Two forms:
/// - `forward_filesystem!(self.inner)` or `forward_filesystem!(self.inner; except a, b)`:
///   every method but those named after `except` is forwarded; the wrapper writes the
///   named ones. For a wrapper that changes a few methods of an otherwise unchanged
///   filesystem: a method added to the trait is forwarded too.
/// - `forward_filesystem!(self.fs; only a, b)`: just the named methods are forwarded.
///   For a wrapper that decides most calls itself (a router): a method added to the
///   trait must then be written there by hand, not passed on unseen.
///
/// The wrapped filesystem is `self` and a path of fields (`self.inner`, `self.0`),
/// whose type implements `FileSystem` itself (not a reference or a smart pointer to
/// one); it is called as `FileSystem::method(&self.inner, ...)`, so an inherent
/// method of the same name on its type is never taken instead. The caller writes the
/// `self`: macro hygiene would keep one written here from being the method's own.
///
/// The compiler checks the lists: a method named but not written is missing from the
/// impl, a method written but not named is defined twice, and a name that is no method
/// of the trait is either.
#[macro_export]
macro_rules! forward_filesystem {
    ($s:ident $(. $field:tt)*) => {
        $crate::forward_filesystem!($s $(. $field)*; except);
    };
    ($s:ident $(. $field:tt)*; except $($name:ident),* $(,)?) => {
        $crate::forward_filesystem!(@each [skip [$($name)*] $s ($s $(. $field)*)]);
    };
    ($s:ident $(. $field:tt)*; only $($name:ident),* $(,)?) => {
        $crate::forward_filesystem!(@each [keep [$($name)*] $s ($s $(. $field)*)]);
    };

    // The trait's methods, in its order: each one's arguments and what its result
    // carries. `$a` is `[skip|keep [names] self (inner)]`.
    (@each $a:tt) => {
        $crate::forward_filesystem!(@one $a lookup(dir: $crate::Ino, name: &[u8]) -> $crate::Attr);
        $crate::forward_filesystem!(@one $a getattr(ino: $crate::Ino) -> $crate::Attr);
        $crate::forward_filesystem!(
            @one $a setattr(ino: $crate::Ino, changes: $crate::SetAttr) -> $crate::Attr
        );
        $crate::forward_filesystem!(
            @one $a create(dir: $crate::Ino, name: &[u8], perm: u32, owner: $crate::Owner)
                -> $crate::Attr
        );
        $crate::forward_filesystem!(
            @one $a mkdir(dir: $crate::Ino, name: &[u8], perm: u32, owner: $crate::Owner)
                -> $crate::Attr
        );
        $crate::forward_filesystem!(
            @one $a mknod(
                dir: $crate::Ino, name: &[u8], full_mode: u32, rdev: u64, owner: $crate::Owner
            ) -> $crate::Attr
        );
        $crate::forward_filesystem!(
            @one $a symlink(dir: $crate::Ino, name: &[u8], target: &[u8], owner: $crate::Owner)
                -> $crate::Attr
        );
        $crate::forward_filesystem!(@one $a readlink(ino: $crate::Ino) -> $crate::__Vec<u8>);
        $crate::forward_filesystem!(
            @one $a link(ino: $crate::Ino, new_dir: $crate::Ino, new_name: &[u8]) -> $crate::Attr
        );
        $crate::forward_filesystem!(@one $a unlink(dir: $crate::Ino, name: &[u8]) -> ());
        $crate::forward_filesystem!(@one $a rmdir(dir: $crate::Ino, name: &[u8]) -> ());
        $crate::forward_filesystem!(
            @one $a rename(
                old_dir: $crate::Ino, old_name: &[u8], new_dir: $crate::Ino, new_name: &[u8]
            ) -> ()
        );
        $crate::forward_filesystem!(
            @one $a readdir(dir: $crate::Ino, offset: u64, max_entries: usize)
                -> $crate::__Vec<$crate::DirEntry>
        );
        $crate::forward_filesystem!(
            @one $a read(ino: $crate::Ino, offset: u64, buf: &mut [u8]) -> usize
        );
        $crate::forward_filesystem!(
            @one $a read_with(
                ino: $crate::Ino, offset: u64, buf: &mut [u8], ctx: $crate::ReadCtx<'_>
            ) -> usize
        );
        $crate::forward_filesystem!(
            @one $a write(ino: $crate::Ino, offset: u64, data: &[u8]) -> usize
        );
        $crate::forward_filesystem!(@one $a append(ino: $crate::Ino, data: &[u8]) -> (u64, usize));
        $crate::forward_filesystem!(
            @one $a clone_range(
                src: $crate::Ino, src_offset: u64, dst: $crate::Ino, dst_offset: u64, len: u64
            ) -> ()
        );
        $crate::forward_filesystem!(
            @one $a getxattr(ino: $crate::Ino, name: &[u8]) -> $crate::__Vec<u8>
        );
        $crate::forward_filesystem!(
            @one $a setxattr(ino: $crate::Ino, name: &[u8], value: &[u8], how: $crate::XattrMode)
                -> ()
        );
        $crate::forward_filesystem!(
            @one $a listxattr(ino: $crate::Ino) -> $crate::__Vec<$crate::__Vec<u8>>
        );
        $crate::forward_filesystem!(@one $a removexattr(ino: $crate::Ino, name: &[u8]) -> ());
        $crate::forward_filesystem!(@one $a statfs() -> $crate::StatFs);
        $crate::forward_filesystem!(@one $a open(ino: $crate::Ino) -> ());
        $crate::forward_filesystem!(@one $a release(ino: $crate::Ino) -> ());
        $crate::forward_filesystem!(@one $a fsync(ino: $crate::Ino, datasync: bool) -> ());
        $crate::forward_filesystem!(@one $a sync() -> ());
        $crate::forward_filesystem!(
            @one $a set_quota(dir: $crate::Ino, limits: $crate::QuotaLimits) -> $crate::QuotaInfo
        );
        $crate::forward_filesystem!(
            @one $a quota(ino: $crate::Ino) -> ::core::option::Option<$crate::QuotaInfo>
        );
        $crate::forward_filesystem!(@one $a statfs_at(ino: $crate::Ino) -> $crate::StatFs);
    };

    // One method: is it named?
    (@one [$how:ident $names:tt $s:ident $to:tt] $m:ident $args:tt -> $ret:ty) => {
        $crate::forward_filesystem!(@find $m $names [$how $s $to $m $args $ret]);
    };

    // `@find method [names] [...]`: whether the names include the method. macro_rules
    // cannot compare two names it was given, so each method has an arm that knows
    // itself at the head of the list; any other head is passed over.
    (@find lookup [lookup $($n:ident)*] $f:tt) => { $crate::forward_filesystem!(@is named $f); };
    (@find getattr [getattr $($n:ident)*] $f:tt) => { $crate::forward_filesystem!(@is named $f); };
    (@find setattr [setattr $($n:ident)*] $f:tt) => { $crate::forward_filesystem!(@is named $f); };
    (@find create [create $($n:ident)*] $f:tt) => { $crate::forward_filesystem!(@is named $f); };
    (@find mkdir [mkdir $($n:ident)*] $f:tt) => { $crate::forward_filesystem!(@is named $f); };
    (@find mknod [mknod $($n:ident)*] $f:tt) => { $crate::forward_filesystem!(@is named $f); };
    (@find symlink [symlink $($n:ident)*] $f:tt) => { $crate::forward_filesystem!(@is named $f); };
    (@find readlink [readlink $($n:ident)*] $f:tt) => {
        $crate::forward_filesystem!(@is named $f);
    };
    (@find link [link $($n:ident)*] $f:tt) => { $crate::forward_filesystem!(@is named $f); };
    (@find unlink [unlink $($n:ident)*] $f:tt) => { $crate::forward_filesystem!(@is named $f); };
    (@find rmdir [rmdir $($n:ident)*] $f:tt) => { $crate::forward_filesystem!(@is named $f); };
    (@find rename [rename $($n:ident)*] $f:tt) => { $crate::forward_filesystem!(@is named $f); };
    (@find readdir [readdir $($n:ident)*] $f:tt) => { $crate::forward_filesystem!(@is named $f); };
    (@find read [read $($n:ident)*] $f:tt) => { $crate::forward_filesystem!(@is named $f); };
    (@find read_with [read_with $($n:ident)*] $f:tt) => {
        $crate::forward_filesystem!(@is named $f);
    };
    (@find write [write $($n:ident)*] $f:tt) => { $crate::forward_filesystem!(@is named $f); };
    (@find append [append $($n:ident)*] $f:tt) => { $crate::forward_filesystem!(@is named $f); };
    (@find clone_range [clone_range $($n:ident)*] $f:tt) => {
        $crate::forward_filesystem!(@is named $f);
    };
    (@find getxattr [getxattr $($n:ident)*] $f:tt) => {
        $crate::forward_filesystem!(@is named $f);
    };
    (@find setxattr [setxattr $($n:ident)*] $f:tt) => {
        $crate::forward_filesystem!(@is named $f);
    };
    (@find listxattr [listxattr $($n:ident)*] $f:tt) => {
        $crate::forward_filesystem!(@is named $f);
    };
    (@find removexattr [removexattr $($n:ident)*] $f:tt) => {
        $crate::forward_filesystem!(@is named $f);
    };
    (@find statfs [statfs $($n:ident)*] $f:tt) => { $crate::forward_filesystem!(@is named $f); };
    (@find open [open $($n:ident)*] $f:tt) => { $crate::forward_filesystem!(@is named $f); };
    (@find release [release $($n:ident)*] $f:tt) => { $crate::forward_filesystem!(@is named $f); };
    (@find fsync [fsync $($n:ident)*] $f:tt) => { $crate::forward_filesystem!(@is named $f); };
    (@find sync [sync $($n:ident)*] $f:tt) => { $crate::forward_filesystem!(@is named $f); };
    (@find set_quota [set_quota $($n:ident)*] $f:tt) => {
        $crate::forward_filesystem!(@is named $f);
    };
    (@find quota [quota $($n:ident)*] $f:tt) => { $crate::forward_filesystem!(@is named $f); };
    (@find statfs_at [statfs_at $($n:ident)*] $f:tt) => {
        $crate::forward_filesystem!(@is named $f);
    };
    (@find $m:ident [$other:ident $($n:ident)*] $f:tt) => {
        $crate::forward_filesystem!(@find $m [$($n)*] $f);
    };
    (@find $m:ident [] $f:tt) => { $crate::forward_filesystem!(@is unnamed $f); };

    // Skipped if named after `except`, or not named after `only`; else forwarded.
    (@is named [skip $($f:tt)*]) => {};
    (@is unnamed [keep $($f:tt)*]) => {};
    (@is $named:ident
        [$how:ident $s:ident ($($to:tt)*) $m:ident ($($arg:ident: $ty:ty),*) $ret:ty]
    ) => {
        async fn $m(&$s, $($arg: $ty),*) -> $crate::FsResult<$ret> {
            $crate::FileSystem::$m(&$($to)*, $($arg),*).await
        }
    };
}
