//! The staging contract of a core Ignition exported (the tiny-core fixture):
//! every operation the scheduler submits packs against its real bindings,
//! snapshot and restore included, with each value in its buffer's own width.

use std::path::PathBuf;

use helios::core::load_manifest;
use helios::core::proto::{DType, Semantic};
use helios::execution::StagingLayout;
use helios::prefix::SnapshotRow;
use helios::scheduler::{Launch, Operation, Restore, Slot, Snapshot};

#[test]
fn snapshot_and_restore_pack_into_the_exported_maintenance_buffers() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-core");
    let core = load_manifest(&dir).unwrap();
    let staging = StagingLayout::new(core.view()).unwrap();
    let base = core.window().base;
    let buffer = |semantic: Semantic| {
        let buffer = core.buffer(semantic).unwrap();
        (base + buffer.offset, DType::try_from(buffer.dtype).unwrap())
    };
    let width = |dtype: DType| if dtype == DType::DtypeI64 { 8 } else { 4 };
    let rows = core.contract().snapshot_rows;
    assert!(rows >= 2, "the fixture has snapshot rows");
    let row = SnapshotRow(rows - 1);
    let restore = Launch {
        page_updates: Vec::new(),
        operation: Operation::Restore(Restore {
            slot: Slot(2),
            row,
            expect: 77,
        }),
    };
    let packed = staging.pack(&restore).unwrap();
    assert!(packed.status && packed.rows == 0);
    let expected = [
        (Semantic::MaintSlot, 2i64),
        (Semantic::MaintRow, i64::from(row.0)),
        (Semantic::MaintExpect, 77),
    ];
    assert_eq!(packed.writes.len(), expected.len());
    for (write, (semantic, value)) in packed.writes.iter().zip(expected) {
        let (addr, dtype) = buffer(semantic);
        assert_eq!(
            (write.addr, write.len),
            (addr, width(dtype)),
            "{semantic:?}"
        );
        let bytes = &packed.bytes[write.offset..write.offset + write.len];
        let found = match bytes.len() {
            8 => i64::from_le_bytes(bytes.try_into().unwrap()),
            _ => i64::from(i32::from_le_bytes(bytes.try_into().unwrap())),
        };
        assert_eq!(found, value, "{semantic:?}");
    }
    let snapshot = Launch {
        page_updates: Vec::new(),
        operation: Operation::Snapshot(Snapshot { slot: Slot(1), row }),
    };
    let packed = staging.pack(&snapshot).unwrap();
    assert_eq!(packed.writes.len(), 2);
    assert_ne!(staging.status_addr(), 0);
    assert_eq!(staging.status_addr(), buffer(Semantic::MaintStatus).0);
}
