//! The key-value layer.

use std::collections::BTreeMap;
use std::io;
use std::ops::Bound;
use std::sync::{Arc, RwLock};

use crate::context::{Context, InstanceId, RequestType};
use crate::stage::Stage;

/// A key-value store as the stage sees it: put, get, delete, scan.
///
/// Implemented by [`StagedKv`] (which enforces, then delegates), by
/// [`MemKv`], and by `rocks-env` for RocksDB.
pub trait KvStore: Send + Sync {
    /// Stores a value.
    fn put(&self, key: &[u8], value: &[u8]) -> io::Result<()>;
    /// Reads a value.
    fn get(&self, key: &[u8]) -> io::Result<Option<Vec<u8>>>;
    /// Deletes a key.
    fn delete(&self, key: &[u8]) -> io::Result<()>;
    /// Visits up to `limit` entries from `start` in key order; returns how
    /// many were visited.
    fn scan(&self, start: &[u8], limit: usize, visit: &mut dyn FnMut(&[u8], &[u8])) -> io::Result<usize>;
}

/// Wraps a [`KvStore`] so every call is enforced by a stage first.
///
/// Request sizes: a put costs key + value bytes, a get and a delete their
/// key's bytes, a scan is one request of size 0 (its result size is not
/// known before it runs).
///
/// ```
/// use std::sync::Arc;
/// use kv_stage::{Stage, layer::{KvStore, MemKv, StagedKv}};
///
/// let stage = Arc::new(Stage::new("kv"));
/// let kv = StagedKv::new(MemKv::default(), Arc::clone(&stage));
/// kv.put(b"k", b"value").unwrap();
/// assert_eq!(kv.get(b"k").unwrap().as_deref(), Some(&b"value"[..]));
/// assert_eq!(stage.collect().channel("default").unwrap().ops, 2);
/// ```
pub struct StagedKv<S> {
    inner: S,
    stage: Arc<Stage>,
    instance: InstanceId,
}

impl<S: KvStore> StagedKv<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, stage: Arc<Stage>) -> Self {
        StagedKv { inner, stage, instance: InstanceId(0) }
    }

    /// Tags every request with an instance id.
    pub fn with_instance(mut self, instance: InstanceId) -> Self {
        self.instance = instance;
        self
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    fn enforce(&self, t: RequestType, size: usize) -> io::Result<()> {
        let ctx = Context::new(t, size as u64).in_instance(self.instance);
        self.stage.enforce(&ctx).map(|_| ()).map_err(io::Error::from)
    }
}

impl<S: KvStore> KvStore for StagedKv<S> {
    fn put(&self, key: &[u8], value: &[u8]) -> io::Result<()> {
        self.enforce(RequestType::Put, key.len() + value.len())?;
        self.inner.put(key, value)
    }

    fn get(&self, key: &[u8]) -> io::Result<Option<Vec<u8>>> {
        self.enforce(RequestType::Get, key.len())?;
        self.inner.get(key)
    }

    fn delete(&self, key: &[u8]) -> io::Result<()> {
        self.enforce(RequestType::Delete, key.len())?;
        self.inner.delete(key)
    }

    fn scan(&self, start: &[u8], limit: usize, visit: &mut dyn FnMut(&[u8], &[u8])) -> io::Result<usize> {
        self.enforce(RequestType::Scan, 0)?;
        self.inner.scan(start, limit, visit)
    }
}

/// An in-memory ordered key-value store.
#[derive(Debug, Default)]
pub struct MemKv {
    map: RwLock<BTreeMap<Vec<u8>, Vec<u8>>>,
}

impl MemKv {
    /// Number of keys.
    pub fn len(&self) -> usize {
        self.map.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl KvStore for MemKv {
    fn put(&self, key: &[u8], value: &[u8]) -> io::Result<()> {
        self.map.write().unwrap_or_else(|e| e.into_inner()).insert(key.to_vec(), value.to_vec());
        Ok(())
    }

    fn get(&self, key: &[u8]) -> io::Result<Option<Vec<u8>>> {
        Ok(self.map.read().unwrap_or_else(|e| e.into_inner()).get(key).cloned())
    }

    fn delete(&self, key: &[u8]) -> io::Result<()> {
        self.map.write().unwrap_or_else(|e| e.into_inner()).remove(key);
        Ok(())
    }

    fn scan(&self, start: &[u8], limit: usize, visit: &mut dyn FnMut(&[u8], &[u8])) -> io::Result<usize> {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        let mut n = 0;
        for (k, v) in map.range::<[u8], _>((Bound::Included(start), Bound::Unbounded)).take(limit) {
            visit(k, v);
            n += 1;
        }
        Ok(n)
    }
}
