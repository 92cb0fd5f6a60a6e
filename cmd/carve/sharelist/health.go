package sharelist

import "github.com/carve-dra/carve/prepare/health"

// AddHealth fills in each row's device health from the health file the
// agent keeps in stateDir: a device it does not name is healthy.
func AddHealth(rows []Row, stateDir string) error {
	f, err := health.ReadFile(stateDir)
	if err != nil {
		return err
	}
	for i := range rows {
		e, ok := f.Devices[rows[i].Device]
		if !ok {
			rows[i].Health = health.Healthy.String()
			continue
		}
		rows[i].Health, rows[i].HealthMessage, rows[i].Taint = e.Severity, e.Message, e.Taint
	}
	return nil
}
