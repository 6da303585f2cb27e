//! Every bad argument gets the right code and a message, also kept as the process's last
//! error. A binary of its own: the last error is process-wide, and no other test may write
//! it meanwhile.

use rustccl::{CommConfig, Communicator, ResultCode, ShrinkFlags, UniqueId};
use rustccl_tests::new_id;

fn one_rank() -> Communicator {
    Communicator::init_rank(1, &new_id(), 0).unwrap()
}

#[test]
fn bad_arguments_get_the_right_code_and_a_message() {
    use ResultCode::*;
    let id = new_id();
    type Init = Box<dyn Fn() -> rustccl::Result<Communicator>>;
    let cases: Vec<(ResultCode, Init)> = vec![
        (InvalidArgument, Box::new(move || Communicator::init_rank(0, &id, 0))),
        (InvalidArgument, Box::new(move || Communicator::init_rank(-3, &id, 0))),
        (InvalidArgument, Box::new(move || Communicator::init_rank(2, &id, 2))),
        (InvalidArgument, Box::new(move || Communicator::init_rank(2, &id, -1))),
        (
            InvalidArgument,
            Box::new(move || {
                Communicator::init_rank_config(1, &id, 0, 0, &CommConfig { magic: 0x1234, ..Default::default() })
            }),
        ),
        (
            InvalidArgument,
            Box::new(move || Communicator::init_rank_config(1, &id, 0, 0, &CommConfig { blocking: 7, ..Default::default() })),
        ),
        (InvalidArgument, Box::new(move || Communicator::init_rank_config(1, &id, 0, -1, &CommConfig::default()))),
        (InvalidArgument, Box::new(move || Communicator::init_rank_scalable(1, 0, &[], 0, &CommConfig::default()))),
        (InvalidArgument, Box::new(move || Communicator::init_rank_scalable(1, 0, &[id, id], 0, &CommConfig::default()))),
    ];
    for (code, init) in cases {
        let e = init().unwrap_err();
        assert_eq!(e.code, code, "{e}");
        assert!(!e.message.is_empty());
        assert_eq!(rustccl::error::last_error(), e.message, "kept for ncclGetLastError");
    }
    assert_eq!(UniqueId::from_bytes(&[0u8; 128]).unwrap_err().code, InvalidArgument);
    assert_eq!(Communicator::init_all(&[]).unwrap_err().code, InvalidArgument);
    assert_eq!(Communicator::init_all(&[0, 0]).unwrap_err().code, InvalidUsage);
    assert_eq!(Communicator::init_all(&[1 << 20]).unwrap_err().code, InvalidArgument);

    let comm = one_rank();
    assert_eq!(comm.send_bytes(0, 1, b"x").unwrap_err().code, InvalidArgument, "send to self");
    assert_eq!(comm.send_bytes(5, 1, b"x").unwrap_err().code, InvalidArgument, "peer out of range");
    assert_eq!(comm.split(-5, 0, None).unwrap_err().code, InvalidArgument);
    assert_eq!(comm.shrink(&[0], None, ShrinkFlags::Default).unwrap_err().code, InvalidUsage);
    assert_eq!(comm.shrink(&[4], None, ShrinkFlags::Default).unwrap_err().code, InvalidArgument);
    assert_eq!(ShrinkFlags::from_i32(9).unwrap_err().code, InvalidArgument);
    comm.finalize().unwrap();
    let e = comm.finalize().unwrap_err();
    assert_eq!(e.code, InvalidArgument);
    assert!(e.message.contains("already finalized"));
    assert_eq!(comm.last_error(), e.message);
    assert_eq!(comm.barrier().unwrap_err().code, InvalidUsage, "use after finalize");
    comm.destroy().unwrap();
    let e = comm.destroy().unwrap_err();
    assert_eq!(e.code, InvalidArgument);
    assert!(e.message.contains("already been destroyed"));
    assert_eq!(comm.count().unwrap_err().code, InvalidArgument, "use after destroy");
    comm.abort().unwrap();
}

