package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db/persist"
)

// recoverCmd rebuilds a host's database from a redo log, for disaster
// recovery or when the database file is lost or corrupt.
func recoverCmd() *cobra.Command {
	var redo, dataDir, hostUUID string
	cmd := &cobra.Command{
		Use:   "recover",
		Short: "rebuild the database in a data dir from a redo log",
		Long: `recover reads the last consistent state of a redo log (the last complete
database record and the deltas after it) and writes it as the database of
a data dir, which must not hold one yet. toolstackd then starts on that data
dir as the host named by --host-uuid (default: the pool's master).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path := filepath.Join(dataDir, "toolstackd.db")
			if _, err := os.Stat(path); err == nil {
				return fmt.Errorf("%s exists: move it aside first", path)
			}
			d, rec, err := persist.RecoverFromRedoLog(redo, dm.Model)
			if err != nil {
				return err
			}
			snap := d.Snapshot()
			if hostUUID == "" {
				for _, p := range snap.All(dm.Pool.Class) {
					if h, ok := snap.Get(dm.Host.Class, p.String(dm.Pool.Master)); ok {
						hostUUID = h.UUID()
					}
				}
			}
			if _, ok := snap.ByUUID(dm.Host.Class, hostUUID); !ok {
				return fmt.Errorf("host %q is not in the recovered database", hostUUID)
			}
			if err := os.MkdirAll(dataDir, 0o700); err != nil {
				return err
			}
			st, err := persist.Open(path, dm.Model, persist.Options{})
			if err != nil {
				return err
			}
			if err := st.ReplaceAll(snap); err != nil {
				_ = st.Close()
				return err
			}
			if err := st.Close(); err != nil {
				return err
			}
			if err := writeInventory(dataDir, hostUUID); err != nil {
				return err
			}
			_, _ = fmt.Fprintf(cmd.OutOrStdout(), "recovered generation %d (database record at %d and %d delta records) into %s as host %s\n",
				snap.Generation(), rec.Gen, len(rec.Deltas), path, hostUUID)
			return nil
		},
	}
	cmd.Flags().StringVar(&redo, "redo-log", "", "the redo log file or block device")
	cmd.Flags().StringVar(&dataDir, "data-dir", defaultDataDir(), "the data dir to write the database into")
	cmd.Flags().StringVar(&hostUUID, "host-uuid", "", "the host this data dir will be (default: the pool master)")
	_ = cmd.MarkFlagRequired("redo-log") // fails only for a flag that does not exist
	return cmd
}
