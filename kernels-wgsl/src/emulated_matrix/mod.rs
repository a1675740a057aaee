//! The matrix tier's kernels with their cooperative matrices emulated in
//! plain WGSL, for the tests: so that the 16×16 f16 tiles in subgroups of
//! 32 that NVIDIA's cards run, and the 8×8 f32 tiles in simdgroups of 32
//! that Apple's GPUs run (neither offered by a software driver), run on
//! lavapipe, through the kernels' own code, and are checked against the f64
//! oracle and the goldens like the 8×8 f16 tiles Mesa 26 runs natively.
//!
//! Each matrix value becomes a slot of T×T f32 values in a storage
//! buffer the tests bind at [`EMULATED_BINDING`], one set of slots for each
//! subgroup of each workgroup, and each tile variable a slot number. Loads,
//! multiply-adds and stores run on the subgroup's first invocation alone,
//! summing each output over its T products in f32 (f16 operands multiply
//! exactly in f32; f32 ones as any f32 multiply-add does). That is sound
//! because a cooperative matrix is only
//! seen through memory: the kernels read what a store wrote, and write
//! what a load reads, on the far side of a workgroup barrier, as the
//! hardware needs too. A subgroup is `subgroup` consecutive invocations of
//! the workgroup (`subgroup_id`, `subgroup_invocation_id` and
//! `subgroup_size` taken from the local index): the layout the kernels
//! assume and NVIDIA's drivers give. No kernel uses subgroup arithmetic, so
//! nothing else depends on the hardware's subgroups.
//!
//! The tiles live in memory, not in variables: Mesa's compiler turns each
//! dynamically indexed element of a variable into a branch over the whole
//! array, and copies of whole tiles into one access an element, which took
//! minutes a kernel. The modules run right on Mesa 26's lavapipe; Mesa
//! 22.3's gives wrong products with them.
//!
//! Built only with the `test-support` feature: the shipped binary has none
//! of it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

mod syntax;
use syntax::{assignment, find_whole, first_call, is_identifier, matching, pointed, split_arguments, statement_end};

/// The type of a tile variable the rewriting declares: a slot number.
const TILE_SLOT: &str = "EmulatedSlot";

/// The binding of the emulated tiles' storage buffer.
pub const EMULATED_BINDING: u32 = 63;

/// The most subgroups a matrix kernel's workgroup holds.
pub const MAX_SUBGROUPS: u32 = 4;

/// An adapter's matrix tier as the emulation presents it: the tiles it
/// lists, its subgroups of `subgroup`, and where set, the workgroup memory
/// the kernels are planned for in place of the adapter's. lavapipe lists 32
/// KiB but allocates what each module declares, so its workgroups take the
/// blocks planned for more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmulatedMatrix {
    pub subgroup: u32,
    pub workgroup_memory: Option<u32>,
    /// What the adapter lists, as (size, A and B's type, C's type).
    lists: &'static [(u32, wgpu::CooperativeScalarType, wgpu::CooperativeScalarType)],
}

use wgpu::CooperativeScalarType::{F16, F32};

impl EmulatedMatrix {
    /// An NVIDIA card's: 16×16 f16 tiles into f32, subgroups of 32, and the
    /// 48 KiB of workgroup memory its Vulkan driver lists (the H200's, in
    /// docs/performance.md), which decides the GEMM's staging and how the
    /// VAE's 512-wide head splits its output dims.
    pub const NVIDIA: EmulatedMatrix = EmulatedMatrix { subgroup: 32, workgroup_memory: Some(48 << 10), lists: &[(16, F16, F32)] };

    /// An Apple GPU's, as wgpu's Metal backend lists its simdgroup matrices
    /// (8×8 f32·f32→f32, f16·f16→f16 and f16·f16→f32), of which the tier
    /// takes the f32 operands; simdgroups of 32; 32 KiB of threadgroup
    /// memory.
    pub const APPLE: EmulatedMatrix = EmulatedMatrix { subgroup: 32, workgroup_memory: Some(32 << 10), lists: &[(8, F32, F32), (8, F16, F16), (8, F16, F32)] };

    /// Mesa 26's lavapipe's own: 8×8 f16 tiles into f32 in subgroups of 8,
    /// to hold the emulation to the driver's cooperative matrices.
    pub const LAVAPIPE: EmulatedMatrix = EmulatedMatrix { subgroup: 8, workgroup_memory: None, lists: &[(8, F16, F32)] };

    /// The setting `FLUX_LITE_EMULATE_MATRIX=nvidia`, `apple` or
    /// `lavapipe`, or why it names none of them.
    pub fn from_setting(value: &str) -> Result<Self, String> {
        match value {
            "nvidia" => Ok(Self::NVIDIA),
            "apple" => Ok(Self::APPLE),
            "lavapipe" => Ok(Self::LAVAPIPE),
            _ => Err(format!("FLUX_LITE_EMULATE_MATRIX={value:?}: give nvidia (16×16 f16 tiles, subgroups of 32), apple (8×8 f32 tiles, subgroups of 32) or lavapipe (8×8 f16 tiles, subgroups of 8)")),
        }
    }

    /// The workgroup memory the matrix tier's kernels are planned for: the
    /// emulated adapter's where it sets one, else the real adapter's
    /// `listed`, lowered to a test's `cap`.
    pub fn planned_memory(self, listed: u32, cap: Option<u32>) -> u32 {
        let memory = self.workgroup_memory.unwrap_or(listed);
        cap.map_or(memory, |cap| memory.min(cap))
    }

    /// What the adapter would list for this.
    pub fn offered(self) -> Vec<wgpu::CooperativeMatrixProperties> {
        let shape = |&(size, ab_type, cr_type): &(u32, wgpu::CooperativeScalarType, wgpu::CooperativeScalarType)| wgpu::CooperativeMatrixProperties {
            m_size: size,
            n_size: size,
            k_size: size,
            ab_type,
            cr_type,
            saturating_accumulation: false,
        };
        self.lists.iter().map(shape).collect()
    }
}

/// `source` (a matrix module as [`crate::Module::source`] assembles it) with
/// its cooperative matrices emulated in subgroups of `subgroup`
/// invocations, or which construct the rewriting does not know.
pub fn emulate(source: &str, subgroup: u32) -> Result<Emulated, String> {
    // Without comments (WGSL has no strings, so `//` always starts one): the
    // rewriting then sees only code.
    let code: String = source.lines().map(|line| line.split("//").next().unwrap_or_default()).collect::<Vec<_>>().join("\n");
    let mut text = code.replace("enable wgpu_cooperative_matrix;\n", "");
    text = replace_matrix_aliases(&text)?;
    let pointers = take_pointer_lets(&mut text)?;
    let mut helpers = Helpers::new(declared_elements(&text));
    let mut slots = rewrite_calls(&mut text, &pointers, &mut helpers)?;
    copy_tiles_by_name(&mut text, &mut slots);
    text = subgroups_from_local_index(&text)?;
    if text.contains("coop_mat") || first_call(&text).is_some() {
        return Err("a cooperative-matrix construct is left after the rewriting".into());
    }
    let mut out = String::new();
    let _ = writeln!(out, "{}", text);
    let _ = writeln!(out, "const EMULATED_SUBGROUP: u32 = {subgroup}u;");
    let _ = writeln!(out, "const EMULATED_SLOTS: u32 = {}u;", slots.total());
    let _ = writeln!(out, "const EMULATED_TEMPS_AT: u32 = {}u;", slots.named);
    let _ = writeln!(out, "const EMULATED_MAX_SUBGROUPS: u32 = {MAX_SUBGROUPS}u;");
    let _ = writeln!(out, "alias {TILE_SLOT} = u32;");
    let _ = writeln!(out, "@group(0) @binding({EMULATED_BINDING}) var<storage, read_write> emulated_tiles: array<f32>;");
    out.push_str(TILE);
    for helper in helpers.written.values() {
        out.push_str(helper);
    }
    Ok(Emulated { source: out, slots: slots.total() })
}

/// A module with its cooperative matrices emulated.
#[derive(Debug)]
pub struct Emulated {
    pub source: String,
    /// Tile slots a subgroup uses.
    pub slots: u32,
}

/// Bytes of the tiles' buffer for a dispatch of `workgroups` workgroups of
/// a module using `slots` slots of `size`×`size` tiles.
pub fn tile_bytes(workgroups: u64, slots: u32, size: u32) -> u64 {
    (workgroups * MAX_SUBGROUPS as u64 * slots as u64 * (size * size) as u64 * 4).max(16)
}

/// Slots given out: one per tile variable, then those a statement's
/// intermediate values take (reused by the next statement).
#[derive(Default)]
struct Slots {
    named: u32,
    temps: u32,
}

impl Slots {
    fn total(&self) -> u32 {
        self.named + self.temps
    }
}

/// The slots' addressing and the multiply-add. `emulated_t` is T on a
/// subgroup's first invocation and 0 on the others, so that only the first
/// runs the tile loops (and every entry point binds the tiles, as the
/// dispatches give them), and a value the compiler cannot see, so that they
/// stay loops (unrolled, a k step's multiply-adds of T³ terms each make one
/// basic block that LLVM's scheduler takes minutes over).
const TILE: &str = "
var<private> emulated_lane: u32;
var<private> emulated_base: u32;
var<private> emulated_t: u32;

fn emulated_slot(slot: u32) -> u32 {
    return emulated_base + slot * T * T;
}

// d += a·b.
fn emulated_multiply_add(a: u32, b: u32, d: u32) {
    let pa = emulated_slot(a);
    let pb = emulated_slot(b);
    let pd = emulated_slot(d);
    for (var row = 0u; row < emulated_t; row++) {
        for (var col = 0u; col < emulated_t; col++) {
            var s = emulated_tiles[pd + row * T + col];
            for (var k = 0u; k < emulated_t; k++) {
                s += emulated_tiles[pa + row * T + k] * emulated_tiles[pb + k * T + col];
            }
            emulated_tiles[pd + row * T + col] = s;
        }
    }
}

// The operand a helper loop's (row, col) reads or writes in an array of
// vectors `width` wide, counted in operands (`at` and `stride` in vectors).
fn emulated_operand(at: u32, stride: u32, row: u32, col: u32, row_major: bool, width: u32) -> u32 {
    return at * width + select(col * stride * width + row, row * stride * width + col, row_major);
}

fn emulated_copy(slot_from: u32, slot_to: u32) {
    for (var i = 0u; i < emulated_t * emulated_t; i++) {
        emulated_tiles[emulated_slot(slot_to) + i] = emulated_tiles[emulated_slot(slot_from) + i];
    }
}
";

/// `alias MatA = coop_mat16x16<f16, A>;` (and MatB, MatC) as the tile.
fn replace_matrix_aliases(text: &str) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut aliases = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        if trimmed.starts_with("alias Mat") && trimmed.contains("coop_mat") {
            let name = trimmed["alias ".len()..].split([' ', '=']).next().unwrap_or_default();
            let _ = writeln!(out, "alias {name} = u32;");
            aliases += 1;
        } else {
            out.push_str(line);
        }
    }
    if aliases == 0 {
        return Err("no `alias Mat… = coop_mat…` to emulate".into());
    }
    Ok(out)
}

/// Each module-scope array's element: `var<workgroup> NAME: array<TYPE, …>`,
/// TYPE a scalar or a vector of them (`vec4<f16>`).
fn declared_elements(text: &str) -> BTreeMap<String, Element> {
    let mut elements = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.trim_start().strip_prefix("var<") else { continue };
        let Some((_, declared)) = rest.split_once('>') else { continue };
        let Some((name, ty)) = declared.split_once(':') else { continue };
        let Some(element) = ty.trim().strip_prefix("array<") else { continue };
        elements.insert(name.trim().to_string(), Element::parse(element));
    }
    elements
}

/// An array's element: its scalar type, and how many of them it holds (1,
/// or a vector's width).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Element {
    scalar: String,
    width: u32,
}

impl Element {
    /// From the text after `array<`: `f32, 64>`, `vec4<f16>, N>`.
    fn parse(declared: &str) -> Self {
        let vector = ["vec2<", "vec3<", "vec4<"].iter().find(|v| declared.starts_with(*v));
        match vector {
            Some(v) => Self { scalar: declared[v.len()..].split('>').next().unwrap_or_default().trim().to_string(), width: v.as_bytes()[3] as u32 - b'0' as u32 },
            None => Self { scalar: declared.split([',', '>']).next().unwrap_or_default().trim().to_string(), width: 1 },
        }
    }

    /// The statement(s) that take the array's operand at a helper loop's
    /// (row, col) as `emulated_e`, then that operand: `at` and `stride`
    /// count elements, as a cooperative load's pointer and stride do, and a
    /// vector's components are consecutive operands.
    fn place(&self, array: &str) -> (String, String) {
        match self.width {
            1 => (String::new(), format!("{array}[{MEMORY}]")),
            w => (format!("let emulated_e = emulated_operand(at, stride, row, col, row_major, {w}u); "), format!("{array}[emulated_e / {w}u][emulated_e % {w}u]")),
        }
    }
}

/// `let NAME = &ARRAY[INDEX];` becomes `let NAME = INDEX;`, and the calls
/// that take NAME as their pointer are rewritten to ARRAY at that index.
fn take_pointer_lets(text: &mut String) -> Result<BTreeMap<String, String>, String> {
    let mut pointers = BTreeMap::new();
    let mut from = 0;
    while let Some(found) = text[from..].find("let ") {
        let start = from + found;
        from = start + 4;
        let rest = &text[start + 4..];
        let Some((name, after)) = rest.split_once(" = &") else { continue };
        if !is_identifier(name) {
            continue;
        }
        let Some(open) = after.find('[') else { continue };
        let array = &after[..open];
        if !is_identifier(array) {
            continue;
        }
        let index_start = start + 4 + name.len() + 4 + open + 1;
        let close = matching(text, index_start - 1, '[', ']')?;
        if !text[close + 1..].starts_with(';') {
            return Err(format!("`let {name} = &{array}[…]` is not a whole statement"));
        }
        let index = text[index_start..close].to_string();
        if let Some(other) = pointers.insert(name.to_string(), array.to_string()).filter(|other| other != array) {
            return Err(format!("`{name}` points into `{other}` in one place and `{array}` in another"));
        }
        text.replace_range(start..close + 1, &format!("let {name} = {index}"));
    }
    Ok(pointers)
}

/// The helpers a module needs: each array's load and store, written once.
struct Helpers {
    elements: BTreeMap<String, Element>,
    written: BTreeMap<String, String>,
}

impl Helpers {
    fn new(elements: BTreeMap<String, Element>) -> Self {
        Self { elements, written: BTreeMap::new() }
    }

    /// `emulated_load_ARRAY(tile, at, stride, row_major)`, written if new.
    fn load(&mut self, array: &str) -> Result<String, String> {
        let element = self.elements.get(array).ok_or_else(|| format!("a cooperative load from `{array}`, which is not a module-scope array"))?;
        let (find, place) = element.place(array);
        let statement = format!("{find}{SLOT} = f32({place});");
        Ok(self.helper(&format!("emulated_load_{array}"), &statement))
    }

    /// `emulated_store_ARRAY(tile, at, stride, row_major)`, written if new.
    fn store(&mut self, array: &str) -> Result<String, String> {
        let element = self.elements.get(array).ok_or_else(|| format!("a cooperative store into `{array}`, which is not a module-scope array"))?;
        let (find, place) = element.place(array);
        let statement = format!("{find}{place} = {}({SLOT});", element.scalar);
        Ok(self.helper(&format!("emulated_store_{array}"), &statement))
    }

    /// `fn NAME(m, at, stride, row_major)` running `statement` for each
    /// element of slot m's tile and its place in memory from `at`, written
    /// once.
    fn helper(&mut self, name: &str, statement: &str) -> String {
        self.written.entry(name.to_string()).or_insert_with(|| {
            format!(
                "
fn {name}(m: u32, at: u32, stride: u32, row_major: bool) {{
    let base = emulated_slot(m);
    for (var row = 0u; row < emulated_t; row++) {{
        for (var col = 0u; col < emulated_t; col++) {{
            {statement}
        }}
    }}
}}
"
            )
        });
        name.to_string()
    }
}

/// An element of a slot's tile, and its place in memory (row-major or
/// column-major from `at`), in a helper's loop.
const SLOT: &str = "emulated_tiles[base + row * T + col]";
const MEMORY: &str = "at + select(col * stride + row, row * stride + col, row_major)";

const CALLS: [&str; 5] = ["coopMultiplyAdd", "coopLoadT", "coopLoad", "coopStoreT", "coopStore"];

/// Every statement holding a cooperative call rewritten into statements
/// over slots (each tile variable a slot number): `let|var NAME = EXPR;`, `NAME = EXPR;`,
/// `coopStore…(VALUE, POINTER, STRIDE);` and `return EXPR;`, EXPR a load, a
/// multiply-add (of loads, names and multiply-adds) or a call returning a tile.
fn rewrite_calls(text: &mut String, pointers: &BTreeMap<String, String>, helpers: &mut Helpers) -> Result<Slots, String> {
    let mut slots = Slots::default();
    while let Some((call, _)) = first_call(text) {
        let start = text[..call].rfind([';', '{', '}']).map_or(0, |i| i + 1);
        let end = statement_end(text, call)?;
        let statement = text[start..end].trim().to_string();
        let indent = "\n    ";
        let mut lowered = Lowering { out: String::new(), temps: 0, pointers, helpers };
        if let Some(rest) = statement.strip_prefix("coopStore") {
            let row_major = rest.starts_with('T');
            let open = statement.find('(').ok_or("a store without arguments")?;
            let close = matching(&statement, open, '(', ')')?;
            let [value, pointer, stride]: [String; 3] = split_arguments(&statement[open + 1..close]).try_into().map_err(|_| format!("`{statement}`: a store takes three arguments"))?;
            let tile = lowered.operand(&value)?;
            let (array, at) = pointed(&pointer, pointers)?;
            let store = lowered.helpers.store(&array)?;
            let _ = write!(lowered.out, "{store}({tile}, {at}, {stride}, {row_major});");
        } else if let Some(expr) = statement.strip_prefix("return ") {
            let result = lowered.temp();
            lowered.evaluate(&result, expr)?;
            let _ = write!(lowered.out, " return {result};");
        } else {
            let (declared, name, expr) = assignment(&statement)?;
            if declared {
                let _ = write!(lowered.out, "let {name}: {TILE_SLOT} = {}u;", slots.named);
                slots.named += 1;
            }
            lowered.evaluate(name, expr)?;
        }
        slots.temps = slots.temps.max(lowered.temps);
        let replacement = format!("{indent}{}", lowered.out.trim());
        text.replace_range(start..end + 1, &replacement);
    }
    Ok(slots)
}

/// A tile variable set from another by name (`var c1 = c0;`, `c1 = c0;`)
/// copies its slot: the names are slot numbers now. Function by function,
/// since a name that is a tile in one may be a number in another.
fn copy_tiles_by_name(text: &mut String, slots: &mut Slots) {
    let mut from = 0;
    while let Some(found) = find_whole(&text[from..], "fn") {
        let at = from + found;
        let Some(body) = text[at..].find('{').map(|i| at + i) else { break };
        let Ok(end) = matching(text, body, '{', '}') else { break };
        let mut function = text[body..=end].to_string();
        let mut tiles: Vec<String> = Vec::new();
        loop {
            // The tiles so far: `let NAME: EmulatedSlot = …;`, as only the rewriting declares them.
            for statement in function.split([';', '{', '}']) {
                let declared = statement.trim().strip_prefix("let ").and_then(|s| s.split_once(": "));
                if let Some((name, _)) = declared.filter(|(_, rest)| rest.starts_with(TILE_SLOT)) {
                    if !tiles.iter().any(|t| t == name) {
                        tiles.push(name.to_string());
                    }
                }
            }
            let copy = function.split_inclusive(';').find_map(|piece| {
                let statement = piece.rsplit(['{', '}', ';']).nth(1).unwrap_or(piece).trim();
                let statement = statement.strip_suffix(';').unwrap_or(statement);
                let (declared, name, value) = assignment(statement).ok()?;
                let known = |n: &str| tiles.iter().any(|t| t == n);
                (known(value) && (declared || known(name)) && name != value).then(|| (statement.to_string(), declared, name.to_string(), value.to_string()))
            });
            let Some((statement, declared, name, value)) = copy else { break };
            let replacement = if declared {
                let slot = slots.named;
                slots.named += 1;
                format!("let {name}: {TILE_SLOT} = {slot}u; emulated_copy({value}, {name})")
            } else {
                format!("emulated_copy({value}, {name})")
            };
            function = function.replacen(&statement, &replacement, 1);
        }
        text.replace_range(body..=end, &function);
        from = body + function.len();
    }
}

/// Statements evaluating tile expressions into slots.
struct Lowering<'a> {
    out: String,
    temps: u32,
    pointers: &'a BTreeMap<String, String>,
    helpers: &'a mut Helpers,
}

impl Lowering<'_> {
    /// `expr`'s value into the slot `dest` (a variable's, or an intermediate one).
    fn evaluate(&mut self, dest: &str, expr: &str) -> Result<(), String> {
        let expr = expr.trim();
        if is_identifier(expr) {
            if expr != dest {
                let _ = write!(self.out, " emulated_copy({expr}, {dest});");
            }
            return Ok(());
        }
        let open = expr.find('(').ok_or_else(|| format!("`{expr}`: not a tile expression"))?;
        let close = matching(expr, open, '(', ')')?;
        if close + 1 != expr.len() {
            return Err(format!("`{expr}`: more than one call"));
        }
        let callee = &expr[..open];
        let args = split_arguments(&expr[open + 1..close]);
        let callee_name = callee.split('<').next().unwrap_or_default();
        match (callee_name, args.as_slice()) {
            ("coopMultiplyAdd", [a, b, c]) => {
                // The sum starts from C in `dest`, then grows in place.
                self.evaluate(dest, c)?;
                let a = self.operand(a)?;
                let b = self.operand(b)?;
                let _ = write!(self.out, " emulated_multiply_add({a}, {b}, {dest});");
            }
            ("coopLoad" | "coopLoadT", [pointer, stride]) => {
                let (array, at) = pointed(pointer, self.pointers)?;
                let load = self.helpers.load(&array)?;
                let _ = write!(self.out, " {load}({dest}, {at}, {stride}, {});", callee_name == "coopLoadT");
            }
            (_, []) if is_identifier(callee) => {
                let _ = write!(self.out, " emulated_copy({expr}, {dest});");
            }
            _ => return Err(format!("`{expr}`: not a tile expression")),
        }
        Ok(())
    }

    /// A slot holding `expr`: the variable's where it is a name, else a new one.
    fn operand(&mut self, expr: &str) -> Result<String, String> {
        let expr = expr.trim();
        if is_identifier(expr) {
            return Ok(expr.to_string());
        }
        let temp = self.temp();
        self.evaluate(&temp, expr)?;
        Ok(temp)
    }

    /// A slot for an intermediate value of this statement.
    fn temp(&mut self) -> String {
        self.temps += 1;
        format!("(EMULATED_TEMPS_AT + {}u)", self.temps - 1)
    }
}

/// Each entry point's subgroup builtins replaced by values from its local
/// index (`subgroup_id` = index / EMULATED_SUBGROUP, and so on), and its
/// subgroup's slots found from its workgroup's place in the grid.
fn subgroups_from_local_index(text: &str) -> Result<String, String> {
    const BUILTINS: [(&str, &str); 3] = [
        ("subgroup_id", "{li} / EMULATED_SUBGROUP"),
        ("subgroup_invocation_id", "{li} % EMULATED_SUBGROUP"),
        ("subgroup_size", "EMULATED_SUBGROUP"),
    ];
    let mut out = text.to_string();
    let mut from = 0;
    while let Some(found) = out[from..].find("@compute") {
        let at = from + found;
        // Past `@workgroup_size(…)`: the parameters are the list after `fn NAME`.
        let fn_at = out[at..].find("fn ").map(|i| at + i).ok_or("an entry point without `fn`")?;
        let open = out[fn_at..].find('(').map(|i| fn_at + i).ok_or("an entry point without parameters")?;
        let close = matching(&out, open, '(', ')')?;
        let mut params = split_arguments(&out[open + 1..close]);
        // The builtins the slots' addressing needs, added where missing.
        let mut builtin = |name: &str| {
            let found = params.iter().find_map(|p| p.strip_prefix(&format!("@builtin({name})")).map(|rest| rest.split(':').next().unwrap_or_default().trim().to_string()));
            found.unwrap_or_else(|| {
                let ty = if name == "local_invocation_index" { "u32" } else { "vec3<u32>" };
                params.push(format!("@builtin({name}) emulated_{name}: {ty}"));
                format!("emulated_{name}")
            })
        };
        let li = builtin("local_invocation_index");
        let wid = builtin("workgroup_id");
        let nwg = builtin("num_workgroups");
        let mut kept = Vec::new();
        let mut lets = String::new();
        for param in &params {
            match BUILTINS.iter().find(|(name, _)| param.starts_with(&format!("@builtin({name})"))) {
                Some((name, value)) => {
                    let var = param[format!("@builtin({name})").len()..].split(':').next().unwrap_or_default().trim();
                    let _ = write!(lets, "\n    let {var} = {};", value.replace("{li}", &li));
                }
                None => kept.push(param.clone()),
            }
        }
        let _ = write!(
            lets,
            "\n    emulated_lane = {li} % EMULATED_SUBGROUP;\
             \n    emulated_t = select(0u, T, emulated_lane == 0u && arrayLength(&emulated_tiles) > 0u);\
             \n    let emulated_group = {wid}.x + {nwg}.x * ({wid}.y + {nwg}.y * {wid}.z);\
             \n    emulated_base = (emulated_group * EMULATED_MAX_SUBGROUPS + {li} / EMULATED_SUBGROUP) * EMULATED_SLOTS * T * T;"
        );
        let body = out[close..].find('{').map(|i| close + i).ok_or("an entry point without a body")?;
        let rewritten = format!("({}){}{{{lets}", kept.join(", "), &out[close + 1..body]);
        out.replace_range(open..body + 1, &rewritten);
        from = open + rewritten.len();
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
