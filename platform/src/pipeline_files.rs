//! Compiled pipelines in files: the [`PipelineStore`] the engine's programs
//! use, one file per adapter and driver in a cache folder they choose.

use flux_lite_kernels::PipelineStore;
use std::path::PathBuf;

/// Pipeline caches as `DIR/KEY.bin`, written whole or not at all.
#[derive(Debug, Clone)]
pub struct PipelineFiles {
    dir: PathBuf,
}

impl PipelineFiles {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    fn path(&self, key: &str) -> PathBuf {
        let name: String = key.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect();
        self.dir.join(format!("{name}.bin"))
    }
}

impl PipelineStore for PipelineFiles {
    fn load(&self, key: &str) -> Option<Vec<u8>> {
        std::fs::read(self.path(key)).ok()
    }

    /// Best effort: a folder that cannot be made or written only costs the
    /// next run its compiles. Concurrent runs each replace the file whole.
    fn save(&self, key: &str, data: &[u8]) {
        let written = std::fs::create_dir_all(&self.dir).and_then(|()| {
            let mut file = tempfile::NamedTempFile::new_in(&self.dir)?;
            std::io::Write::write_all(&mut file, data)?;
            file.persist(self.path(key)).map(|_| ()).map_err(|e| e.error)
        });
        let _ = written;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_cache_loads_back_and_keys_become_file_names() {
        let dir = tempfile::tempdir().unwrap();
        let files = PipelineFiles::new(dir.path().join("nested"));
        assert_eq!(files.load("wgpu_vulkan_1/2"), None);
        files.save("wgpu_vulkan_1/2", b"blob");
        assert_eq!(files.load("wgpu_vulkan_1/2").as_deref(), Some(b"blob".as_slice()));
        assert!(dir.path().join("nested/wgpu_vulkan_1_2.bin").is_file());
    }
}
