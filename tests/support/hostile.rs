//! Hostile TorchScript models, made without PyTorch: a scripted archive's `code/` is TorchScript source
//! that libtorch compiles again on load, so rewriting the `forward` of a committed benign model
//! (tests/fixtures/byo/bn_mlp.pt: `forward(numeric [N, 8]) -> [N, 3]`) gives a model that does what a
//! hostile member of another team would write.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

const BASE: &str = "tests/fixtures/byo/bn_mlp.pt";
const ROOT_CODE: &str = "bn_mlp/code/__torch__.py";

/// The root module's source with `body` run at the start of `forward` (indented 4 spaces).
fn root_source(body: &str) -> String {
    let body: String = body.lines().map(|l| format!("    {l}\n")).collect();
    format!(
        "class BatchNormMlp(Module):\n  __parameters__ = []\n  __buffers__ = []\n  training : bool\n  \
         _is_full_backward_hook : Optional[bool]\n  net : __torch__.torch.nn.modules.container.Sequential\n  \
         def forward(self: __torch__.BatchNormMlp,\n    numeric: Tensor) -> Tensor:\n{body}    net = self.net\n    \
         return (net).forward(numeric, )\n"
    )
}

/// Writes the benign model with `body` prepended to its forward as `dir/name.pt`.
pub fn model(dir: &Path, name: &str, body: &str) -> PathBuf {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join(BASE);
    let mut archive = zip::ZipArchive::new(std::fs::File::open(base).unwrap()).unwrap();
    let path = dir.join(format!("{name}.pt"));
    let mut out = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
    let stored = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for i in 0..archive.len() {
        let mut entry = archive.by_index(i).unwrap();
        let entry_name = entry.name().to_string();
        // the debug tables map source ranges of the original code: dropped (they are optional)
        if entry_name.ends_with(".debug_pkl") {
            continue;
        }
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).unwrap();
        if entry_name == ROOT_CODE {
            bytes = root_source(body).into_bytes();
        }
        out.start_file(entry_name, stored).unwrap();
        out.write_all(&bytes).unwrap();
    }
    out.finish().unwrap();
    path
}

/// Reads the first `n` bytes of `path` as a string and raises them: the check's refusal would carry them.
pub fn raise_file(path: &Path, n: usize) -> String {
    format!(
        "t = torch.from_file(\"{}\", False, {n}, dtype=0)\ns = \"LEAK:\"\nfor i in range({n}):\n  s = s + chr(int(t[i]))\n\
         ops.prim.RaiseException(s, \"builtins.RuntimeError\")",
        path.display()
    )
}

/// Writes a tensor to `path` on the host (`torch.save`).
pub fn save_file(path: &Path) -> String {
    format!("torch.save(numeric, \"{}\")", path.display())
}

/// Behaves for the upload's two-sample check; on a training batch (more than two samples) prints the first
/// `n` bytes of `read` (the job's logs would carry them) and saves a tensor to `write`.
pub fn delayed(read: &Path, n: usize, write: &Path) -> String {
    format!(
        "if torch.size(numeric, 0) > 2:\n  t = torch.from_file(\"{}\", False, {n}, dtype=0)\n  s = \"LEAK:\"\n  \
         for i in range({n}):\n    s = s + chr(int(t[i]))\n  print(s)\n  torch.save(numeric, \"{}\")",
        read.display(),
        write.display()
    )
}
