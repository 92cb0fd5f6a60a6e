package gpu

import (
	"encoding/binary"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// NVML answers each field value with its own return: a driver before r570
// answers the recovery action NOT_SUPPORTED in the value, SUCCESS for the
// call. Only a value answered SUCCESS is read.
func TestRecoveryActionReadsOnlyAnsweredValues(t *testing.T) {
	for _, tc := range []struct {
		name      string
		call, val nvml.Return
		typ       nvml.ValueType
		want      nvml.DeviceGpuRecoveryAction
		wantKnown bool
	}{
		{"answered", nvml.SUCCESS, nvml.SUCCESS, nvml.VALUE_TYPE_UNSIGNED_INT, nvml.GPU_RECOVERY_ACTION_NODE_REBOOT, true},
		{"answered as a long long", nvml.SUCCESS, nvml.SUCCESS, nvml.VALUE_TYPE_UNSIGNED_LONG_LONG, nvml.GPU_RECOVERY_ACTION_NODE_REBOOT, true},
		{"field not supported", nvml.SUCCESS, nvml.ERROR_NOT_SUPPORTED, nvml.VALUE_TYPE_UNSIGNED_INT, 0, false},
		{"call failed", nvml.ERROR_GPU_IS_LOST, nvml.SUCCESS, nvml.VALUE_TYPE_UNSIGNED_INT, 0, false},
		{"a double", nvml.SUCCESS, nvml.SUCCESS, nvml.VALUE_TYPE_DOUBLE, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev := &mock.Device{GetFieldValuesFunc: func(v []nvml.FieldValue) nvml.Return {
				if len(v) != 1 || v[0].FieldId != nvml.FI_DEV_GET_GPU_RECOVERY_ACTION {
					t.Fatalf("asked %+v", v)
				}
				v[0].NvmlReturn, v[0].ValueType = uint32(tc.val), uint32(tc.typ)
				binary.LittleEndian.PutUint64(v[0].Value[:], uint64(nvml.GPU_RECOVERY_ACTION_NODE_REBOOT))
				return tc.call
			}}
			got, known := recoveryAction(dev)
			if got != tc.want || known != tc.wantKnown {
				t.Fatalf("recoveryAction = %d, %v; want %d, %v", got, known, tc.want, tc.wantKnown)
			}
		})
	}
}
