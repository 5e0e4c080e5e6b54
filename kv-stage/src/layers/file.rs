//! A file whose I/O goes through a stage.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::Arc;

use crate::context::{Context, InstanceId, RequestContext, RequestType};
use crate::stage::Stage;

/// A `std::fs::File` whose reads, writes, syncs, truncations, open and close
/// are enforced by a stage before they happen.
///
/// Reads are charged the size of the buffer asked for (the bytes that will
/// be read are not known before the call). The request context is the one
/// set with [`with_context`](Self::with_context), or else the calling
/// thread's (see [`ContextScope`](crate::ContextScope)).
///
/// ```
/// use std::io::{Read, Write};
/// use std::sync::Arc;
/// use kv_stage::{Stage, layer::StagedFile};
///
/// let stage = Arc::new(Stage::new("files"));
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("data");
/// let mut f = StagedFile::create(Arc::clone(&stage), &path).unwrap();
/// f.write_all(b"hello").unwrap();
/// f.sync_all().unwrap();
/// // open, write, sync: three requests, five bytes.
/// let c = stage.collect().channel("default").unwrap();
/// assert_eq!((c.ops, c.bytes), (3, 5));
/// let mut s = String::new();
/// StagedFile::open(Arc::clone(&stage), &path).unwrap().read_to_string(&mut s).unwrap();
/// assert_eq!(s, "hello");
/// ```
#[derive(Debug)]
pub struct StagedFile {
    file: File,
    stage: Arc<Stage>,
    context: Option<RequestContext>,
    instance: InstanceId,
}

fn enforce(stage: &Stage, ctx: &Context) -> io::Result<()> {
    stage.enforce(ctx).map(|_| ()).map_err(io::Error::from)
}

impl StagedFile {
    /// Opens a file for reading (enforced as an `open` request).
    pub fn open(stage: Arc<Stage>, path: impl AsRef<Path>) -> io::Result<Self> {
        Self::open_with(stage, OpenOptions::new().read(true), path)
    }

    /// Creates (or truncates) a file for writing (enforced as `open`).
    pub fn create(stage: Arc<Stage>, path: impl AsRef<Path>) -> io::Result<Self> {
        Self::open_with(stage, OpenOptions::new().write(true).create(true).truncate(true), path)
    }

    /// Opens with explicit options (enforced as `open`).
    pub fn open_with(stage: Arc<Stage>, options: &OpenOptions, path: impl AsRef<Path>) -> io::Result<Self> {
        enforce(&stage, &Context::new(RequestType::Open, 0))?;
        let file = options.open(path)?;
        Ok(Self::from_file(stage, file))
    }

    /// Wraps an already open file.
    pub fn from_file(stage: Arc<Stage>, file: File) -> Self {
        StagedFile { file, stage, context: None, instance: InstanceId(0) }
    }

    /// Tags every request of this file with a request context.
    pub fn with_context(mut self, context: RequestContext) -> Self {
        self.context = Some(context);
        self
    }

    /// Tags every request of this file with an instance id.
    pub fn with_instance(mut self, instance: InstanceId) -> Self {
        self.instance = instance;
        self
    }

    fn ctx(&self, t: RequestType, size: u64) -> Context {
        let c = Context::new(t, size).in_instance(self.instance);
        match self.context {
            Some(rc) => c.in_context(rc),
            None => c,
        }
    }

    /// `fsync` (enforced as a `sync` request).
    pub fn sync_all(&self) -> io::Result<()> {
        enforce(&self.stage, &self.ctx(RequestType::Sync, 0))?;
        self.file.sync_all()
    }

    /// `fdatasync` (enforced as a `sync` request).
    pub fn sync_data(&self) -> io::Result<()> {
        enforce(&self.stage, &self.ctx(RequestType::Sync, 0))?;
        self.file.sync_data()
    }

    /// Truncates or extends (enforced as `truncate`).
    pub fn set_len(&self, len: u64) -> io::Result<()> {
        enforce(&self.stage, &self.ctx(RequestType::Truncate, 0))?;
        self.file.set_len(len)
    }

    /// Closes the file (enforced as `close`). Dropping closes without
    /// enforcement.
    pub fn close(self) -> io::Result<()> {
        enforce(&self.stage, &self.ctx(RequestType::Close, 0))
    }

    /// The wrapped file.
    pub fn get_ref(&self) -> &File {
        &self.file
    }

    /// Unwraps the file.
    pub fn into_inner(self) -> File {
        self.file
    }
}

impl Read for StagedFile {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        enforce(&self.stage, &self.ctx(RequestType::Read, buf.len() as u64))?;
        self.file.read(buf)
    }
}

impl Write for StagedFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        enforce(&self.stage, &self.ctx(RequestType::Write, buf.len() as u64))?;
        self.file.write(buf)
    }

    /// `File::flush` does no I/O, so it is not enforced.
    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl Seek for StagedFile {
    /// Moving the offset does no I/O, so it is not enforced.
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        self.file.seek(pos)
    }
}

/// Deletes a file (enforced as a `delete` request).
pub fn remove_file(stage: &Stage, path: impl AsRef<Path>) -> io::Result<()> {
    enforce(stage, &Context::new(RequestType::Delete, 0))?;
    std::fs::remove_file(path)
}

/// Renames a file (enforced as a `rename` request).
pub fn rename(stage: &Stage, from: impl AsRef<Path>, to: impl AsRef<Path>) -> io::Result<()> {
    enforce(stage, &Context::new(RequestType::Rename, 0))?;
    std::fs::rename(from, to)
}
