//! A model's fingerprint: which weights made an image, cheap enough to take
//! on every run. A checksum of every byte would read gigabytes before each
//! generation; this reads at most 192 KiB a file.

use super::{Component, ModelFolder};
use sha2::{Digest, Sha256};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// The bytes read at each sampled place of a weight file.
const SAMPLE: u64 = 64 << 10;

/// SHA-256 over every component's weight files in order (text encoder,
/// transformer, VAE; each folder's files by name): for each file its name,
/// its length, and 64 KiB at its start, middle and end, which hold the
/// header (every tensor's name, type and shape) and values from the front,
/// the middle and the back. Two checkpoints of one architecture differ in
/// all three samples however they were trained; only files altered in the
/// unsampled bytes alone would share a fingerprint. Written `sha256:` and
/// 16 hex digits, as image tools show a model hash.
pub fn fingerprint(model: &ModelFolder) -> std::io::Result<String> {
    let mut hash = Sha256::new();
    for component in Component::ALL {
        for file in model.weight_files(component)? {
            sample(&mut hash, &file)?;
        }
    }
    let digest = hash.finalize();
    Ok(format!("sha256:{}", digest[..8].iter().map(|b| format!("{b:02x}")).collect::<String>()))
}

fn sample(hash: &mut Sha256, path: &Path) -> std::io::Result<()> {
    let mut file = std::fs::File::open(path)?;
    let length = file.metadata()?.len();
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    hash.update((name.len() as u64).to_le_bytes());
    hash.update(name.as_bytes());
    hash.update(length.to_le_bytes());
    let mut buffer = Vec::with_capacity(SAMPLE as usize);
    for start in [0, (length / 2).saturating_sub(SAMPLE / 2), length.saturating_sub(SAMPLE)] {
        file.seek(SeekFrom::Start(start))?;
        buffer.clear();
        (&mut file).take(SAMPLE).read_to_end(&mut buffer)?;
        hash.update(&buffer);
    }
    Ok(())
}

impl ModelFolder {
    /// The files a component's weights are read from: its replacement file
    /// (`--transformer FILE`, `--text-encoder FILE`), else the weight files
    /// in its folder, by name.
    pub fn weight_files(&self, component: Component) -> std::io::Result<Vec<PathBuf>> {
        let replacement = match component {
            Component::Transformer => self.transformer_file.clone(),
            Component::TextEncoder => self.text_encoder_file.clone(),
            Component::Vae => None,
        };
        if let Some(file) = replacement {
            return Ok(vec![file]);
        }
        let mut files: Vec<PathBuf> = std::fs::read_dir(self.component_dir(component.dir()))?
            .flatten()
            .filter(|e| super::weight_file_kind(&e.file_name().to_string_lossy()).is_some())
            .map(|e| e.path())
            .collect();
        files.sort();
        Ok(files)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(name: &str) -> ModelFolder {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../test_vectors/models").join(name);
        ModelFolder::open(&root).unwrap()
    }

    #[test]
    fn a_fingerprint_names_the_weights_not_the_folder() {
        let a = fingerprint(&model("tiny-a")).unwrap();
        assert!(a.starts_with("sha256:") && a.len() == 7 + 16, "{a}");
        assert_eq!(fingerprint(&model("tiny-a")).unwrap(), a, "the same files, the same fingerprint");
        assert_ne!(fingerprint(&model("tiny-b")).unwrap(), a);
        // One changed byte in a sampled place is another model.
        let dir = std::env::temp_dir().join(format!("flux-lite-fingerprint-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        copy_tree(&model("tiny-a").root, &dir);
        assert_eq!(fingerprint(&ModelFolder::open(&dir).unwrap()).unwrap(), a, "a copy elsewhere is the same model");
        let vae = dir.join("vae/diffusion_pytorch_model.safetensors");
        let mut bytes = std::fs::read(&vae).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&vae, bytes).unwrap();
        assert_ne!(fingerprint(&ModelFolder::open(&dir).unwrap()).unwrap(), a);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn copy_tree(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap().flatten() {
            let target = to.join(entry.file_name());
            match entry.file_type().unwrap().is_dir() {
                true => copy_tree(&entry.path(), &target),
                false => drop(std::fs::copy(entry.path(), &target).unwrap()),
            }
        }
    }
}
