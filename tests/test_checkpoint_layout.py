"""A step written packed (one array per dtype, the layout in the step's metadata) restores leaf for leaf, and a
step written the earlier way (one orbax array per leaf) still resumes."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from jaxdecouple.checkpoint import LAYOUT_KEY, Checkpointer, checksums, pack, unpack


def leaves_of_every_kind():
  return [np.arange(12, dtype=np.float32).reshape(3, 4), np.array(7, np.int32), np.zeros((0, 5), np.float32),
          np.array([1.5, -2.25], jnp.bfloat16), np.array([True, False]), np.arange(6, dtype=np.int32).reshape(2, 3),
          np.float32(3.0) * np.ones((2, 1, 2), np.float32)]


def test_pack_keeps_every_leaf_and_unpack_refuses_arrays_that_do_not_fit():
  host = leaves_of_every_kind()
  packed, layout = pack(host)
  assert sorted(packed) == ['bfloat16', 'bool', 'float32', 'int32']  # one array per dtype
  assert packed['float32'].size == 12 + 0 + 4 and packed['int32'].size == 1 + 6
  np.testing.assert_array_equal(packed['float32'][:12], np.arange(12))  # leaf order, end to end
  assert layout[0] == [[3, 4], 'float32'] and layout[1] == [[], 'int32']
  back = unpack(packed, layout)
  for a, b in zip(back, host):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a, b)
  with pytest.raises(ValueError, match='shorter than their layout'):
    unpack({**packed, 'int32': packed['int32'][:-1]}, layout)
  with pytest.raises(ValueError, match='longer than their layout'):
    unpack({**packed, 'bool': np.ones(3, bool)}, layout)


def test_a_packed_step_is_one_array_per_dtype_and_restores_onto_the_templates_devices(tmp_path):
  devices = jax.devices()
  state = {'a': jax.device_put(jnp.arange(6.0).reshape(2, 3), devices[1]), 'b': jnp.array([3, 4], jnp.int32),
           'c': jax.device_put(jnp.ones((4,), jnp.bfloat16), devices[2])}
  ckpt = Checkpointer(str(tmp_path), keep=2)
  ckpt.save(5, state)
  ckpt.close()
  manager = ocp.CheckpointManager(str(tmp_path), item_handlers=ocp.StandardCheckpointHandler())
  assert sorted(manager.item_metadata(5).tree['packed']) == ['bfloat16', 'float32', 'int32']
  assert manager.metadata(5).custom_metadata[LAYOUT_KEY] == [[[2, 3], 'float32'], [[2], 'int32'], [[4], 'bfloat16']]
  template = jax.tree.map(jnp.zeros_like, state)
  step, back = Checkpointer(str(tmp_path), keep=2).restore_latest(template)
  assert step == 5
  for name in state:
    assert back[name].dtype == state[name].dtype and back[name].sharding == template[name].sharding
    np.testing.assert_array_equal(np.asarray(back[name]), np.asarray(state[name]))


def test_a_step_of_one_array_per_leaf_written_earlier_still_resumes(tmp_path):
  """The layout before packing (an orbax array per leaf, checksums beside): read as it was."""
  state = [jnp.arange(4.0), jnp.array([[1, 2]], jnp.int32)]
  manager = ocp.CheckpointManager(str(tmp_path), item_handlers=ocp.StandardCheckpointHandler(),
                                  options=ocp.CheckpointManagerOptions(create=True))
  manager.save(3, args=ocp.args.StandardSave({'leaves': state}))
  manager.wait_until_finished()
  os.makedirs(tmp_path / 'checksums', exist_ok=True)
  with open(tmp_path / 'checksums' / '3.json', 'w', encoding='utf-8') as f:
    json.dump(checksums(state), f)
  step, back = Checkpointer(str(tmp_path), keep=2).restore_latest([jnp.zeros(4), jnp.zeros((1, 2), jnp.int32)])
  assert step == 3
  for a, b in zip(back, state):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_each_process_keeps_two_steps_however_few_are_asked_for(tmp_path):
  """A multi-process pipeline's processes write their own files one after another: with the step before deleted
  as soon as this process wrote the next, a process killed before writing it would leave the processes no step in
  common. So two are kept even with keep_checkpoints=1 (and every step with 0, as orbax keeps them)."""
  from jaxdecouple.checkpoint_files import ProcessFiles
  for keep, left in ((1, [3, 4]), (2, [3, 4]), (3, [2, 3, 4]), (0, [1, 2, 3, 4])):
    files = ProcessFiles(str(tmp_path / f'keep{keep}'), keep)
    for step in (1, 2, 3, 4):
      files.save(step, [np.full(2, step, np.float32)])
    assert files.all_steps() == left
    np.testing.assert_array_equal(files.restore(3)[0], [3, 3])
